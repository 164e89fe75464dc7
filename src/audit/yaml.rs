//! The YAML podmend writes for people and tools (`-o yaml`, PolicyReports): a JSON value as
//! block YAML that every reader takes back as the same value. Reading YAML is elsewhere
//! (`serde_yaml_ng`, in [`manifests`](super::manifests)).
//!
//! Kubernetes reads YAML with YAML 1.1 resolution (go-yaml under sigs.k8s.io/yaml, as kubectl,
//! Helm and the API server do; PyYAML alike): there a plain `yes`, `on`, `y`, `1_000`, `0777`,
//! `1:20` or `2001-12-14` is a boolean, a number or a timestamp. So a string is written plain
//! only when it is clearly a string to every YAML 1.1 and YAML 1.2 reader, and quoted
//! otherwise, keys included; numbers are written so that both read the same number.
//!
//! The layout follows what `serde_yaml_ng` (libyaml) writes: two-space indentation, sequences
//! inside a mapping at the key's column, keys in the value's order, `{}` and `[]` for empty
//! collections, single quotes where quoting is needed and a literal block (`|`) for a
//! multi-line string that a literal block carries exactly; double quotes with escapes for the
//! rest.

use serde_json::{Map, Number, Value};

/// Keys longer than this (in bytes, as written) use the explicit `? key` form: YAML readers
/// refuse an implicit key longer than 1024 characters.
const LONGEST_IMPLICIT_KEY: usize = 1000;

/// The YAML text of `value`, ending with a line break.
pub fn to_string(value: &Value) -> String {
    let mut out = String::new();
    match value {
        Value::Object(map) if !map.is_empty() => mapping(&mut out, map, 0, false),
        Value::Array(items) if !items.is_empty() => sequence(&mut out, items, 0, false),
        // A document that is one scalar: never a literal block, which needs a parent indent.
        scalar => {
            out.push_str(&flow_scalar(scalar));
            out.push('\n');
        }
    }
    out
}

/// A block mapping whose keys start at column `indent`. `inline`: the first key goes on the
/// current line (after a sequence's `- `).
fn mapping(out: &mut String, map: &Map<String, Value>, indent: usize, mut inline: bool) {
    for (key, value) in map {
        if !inline {
            pad(out, indent);
        }
        inline = false;
        let key = quoted_or_plain(key);
        if key.len() > LONGEST_IMPLICIT_KEY {
            // `? key` then `: value`, the value written as a sequence entry's would be.
            out.push_str("? ");
            out.push_str(&key);
            out.push('\n');
            pad(out, indent);
            out.push(':');
            entry(out, value, indent);
            continue;
        }
        out.push_str(&key);
        out.push(':');
        match value {
            Value::Object(inner) if !inner.is_empty() => {
                out.push('\n');
                mapping(out, inner, indent + 2, false);
            }
            Value::Array(items) if !items.is_empty() => {
                out.push('\n');
                sequence(out, items, indent, false);
            }
            Value::String(text) if literal_block(text).is_some() => {
                out.push(' ');
                literal(out, text, indent);
            }
            scalar => {
                out.push(' ');
                out.push_str(&flow_scalar(scalar));
                out.push('\n');
            }
        }
    }
}

/// A block sequence whose `- ` start at column `indent`.
fn sequence(out: &mut String, items: &[Value], indent: usize, mut inline: bool) {
    for item in items {
        if !inline {
            pad(out, indent);
        }
        inline = false;
        out.push('-');
        entry(out, item, indent);
    }
}

/// What follows a `-` (or an explicit key's `:`) at column `indent`: a space and the value,
/// collections compact on the same line.
fn entry(out: &mut String, value: &Value, indent: usize) {
    out.push(' ');
    match value {
        Value::Object(inner) if !inner.is_empty() => mapping(out, inner, indent + 2, true),
        Value::Array(inner) if !inner.is_empty() => sequence(out, inner, indent + 2, true),
        Value::String(text) if literal_block(text).is_some() => literal(out, text, indent),
        scalar => {
            out.push_str(&flow_scalar(scalar));
            out.push('\n');
        }
    }
}

fn pad(out: &mut String, indent: usize) {
    out.extend(std::iter::repeat_n(' ', indent));
}

/// A scalar, or an empty collection, on one line.
fn flow_scalar(value: &Value) -> String {
    match value {
        Value::Null => "null".to_string(),
        Value::Bool(true) => "true".to_string(),
        Value::Bool(false) => "false".to_string(),
        Value::Number(number) => number_text(number),
        Value::String(text) => quoted_or_plain(text),
        Value::Array(_) => "[]".to_string(),
        Value::Object(_) => "{}".to_string(),
    }
}

/// Integers as decimal digits; floats in the shortest form that reads back as the same
/// `f64`, always with a `.` and a signed exponent: YAML 1.1 reads `1e100` as a string and
/// `100` as an integer, `1.0e+100` and `100.0` as floats.
fn number_text(number: &Number) -> String {
    if !number.is_f64() {
        return number.to_string();
    }
    let Some(float) = number.as_f64() else {
        return number.to_string();
    };
    if float.is_nan() {
        return ".nan".to_string();
    }
    if float.is_infinite() {
        return if float > 0.0 { ".inf" } else { "-.inf" }.to_string();
    }
    // serde_json prints floats in their shortest round-trip form (`0.1`, `100.0`, `1e100`,
    // `1.5e-7`).
    let text = number.to_string();
    let (mantissa, exponent) = match text.split_once(['e', 'E']) {
        Some((mantissa, exponent)) => (mantissa, Some(exponent)),
        None => (text.as_str(), None),
    };
    let mut out = mantissa.to_string();
    if !out.contains('.') {
        out.push_str(".0");
    }
    if let Some(exponent) = exponent {
        out.push('e');
        if !exponent.starts_with(['-', '+']) {
            out.push('+');
        }
        out.push_str(exponent);
    }
    out
}

/// Plain when clearly a string to every reader, else single-quoted when that can carry it,
/// else double-quoted with escapes. Always one line.
fn quoted_or_plain(text: &str) -> String {
    if plain_is_safe(text) {
        text.to_string()
    } else if single_quotes_can_carry(text) {
        format!("'{}'", text.replace('\'', "''"))
    } else {
        double_quoted(text)
    }
}

/// Words some YAML 1.1 or 1.2 reader resolves to a boolean, null, a merge key or the `=`
/// value key, compared ignoring case (which also catches spellings no reader resolves).
#[rustfmt::skip]
const RESERVED_WORDS: &[&str] = &[
    "y", "yes", "n", "no", "true", "false", "on", "off", "null", "~", "<<", "=",
];

/// Every character that can occur in a YAML 1.1 or 1.2 integer, float or timestamp
/// (`0x1F`, `0o17`, `0b1`, `1_000`, `1:20`, `6.8523015e+5`, `.inf`, `.NaN`,
/// `2001-12-14t21:59:43.10-05:00`, `2001-12-14 21:59:43.10 Z`).
const NUMBER_CHARACTERS: &str = "0123456789+-._: eExXoObBaAcCdDfFtTzZiInN";

/// A string that plain style carries as itself to every reader: printable ASCII, no
/// indicator where one would act, no word or number some reader resolves.
fn plain_is_safe(text: &str) -> bool {
    let bytes = text.as_bytes();
    let (Some(&first), Some(&last)) = (bytes.first(), bytes.last()) else {
        return false; // the empty string is null
    };
    if !bytes.iter().all(|b| (b' '..=b'~').contains(b)) || first == b' ' || last == b' ' {
        return false;
    }
    // Indicators that start something else: block entries, keys, flow collections,
    // comments, anchors, aliases, tags, block scalars, quotes, directives, reserved.
    let second = bytes.get(1).copied();
    match first {
        b'-' if second.is_some_and(|c| c != b' ') => {}
        b'-' | b'?' | b':' | b',' | b'[' | b']' | b'{' | b'}' | b'#' | b'&' | b'*' | b'!'
        | b'|' | b'>' | b'\'' | b'"' | b'%' | b'@' | b'`' => return false,
        _ => {}
    }
    // Document markers, wherever the value lands.
    if text.starts_with("---") || text.starts_with("...") {
        return false;
    }
    // `: ` and a final `:` end a key; ` #` starts a comment.
    if text.contains(": ") || last == b':' || text.contains(" #") {
        return false;
    }
    if RESERVED_WORDS
        .iter()
        .any(|word| word.eq_ignore_ascii_case(text))
    {
        return false;
    }
    !looks_like_a_number(text)
}

/// Starts like a number (a digit, `.` or `_`, after at most one sign) and has only
/// characters numbers and timestamps are made of: some reader may take it for one.
fn looks_like_a_number(text: &str) -> bool {
    let unsigned = text.strip_prefix(['+', '-']).unwrap_or(text);
    unsigned.starts_with(|c: char| c.is_ascii_digit() || c == '.' || c == '_')
        && text.chars().all(|c| NUMBER_CHARACTERS.contains(c))
}

/// Characters every reader accepts as they are inside quotes: YAML's printable set, less
/// the byte order mark and line breaks (YAML 1.1 counts NEL, LS and PS as line breaks).
fn printable(c: char) -> bool {
    matches!(c, ' '..='~' | '\u{A0}'..='\u{D7FF}' | '\u{E000}'..='\u{FFFD}' | '\u{10000}'..)
        && !matches!(c, '\u{FEFF}' | '\u{2028}' | '\u{2029}')
}

/// Single quotes carry any one line of printable characters (tabs go double-quoted, where
/// they are visible as `\t`).
fn single_quotes_can_carry(text: &str) -> bool {
    text.chars().all(printable)
}

/// A double-quoted scalar: `\` and `"` escaped, everything outside [`printable`] as an escape
/// both YAML 1.1 and 1.2 define.
fn double_quoted(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 2);
    out.push('"');
    for c in text.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\0' => out.push_str("\\0"),
            '\t' => out.push_str("\\t"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\u{1B}' => out.push_str("\\e"),
            '\u{85}' => out.push_str("\\N"),
            '\u{2028}' => out.push_str("\\L"),
            '\u{2029}' => out.push_str("\\P"),
            c if printable(c) => out.push(c),
            c if (c as u32) <= 0xFF => out.push_str(&format!("\\x{:02X}", c as u32)),
            c => out.push_str(&format!("\\u{:04X}", c as u32)),
        }
    }
    out.push('"');
    out
}

/// How a literal block scalar (`|`) carries `text` exactly, if it can: `Some(true)` when it
/// needs an indentation indicator (its first line starts with a space or tab). Only for
/// multi-line text of printable characters and tabs, without `\r`, and without whitespace at
/// the end of a line (readers drop whitespace-only lines' spaces, and editors the others).
fn literal_block(text: &str) -> Option<bool> {
    if !text.contains('\n')
        || text.chars().all(|c| c == '\n')
        || !text.chars().all(|c| c == '\n' || c == '\t' || printable(c))
        || text.split('\n').any(|line| line.ends_with([' ', '\t']))
    {
        return None;
    }
    let first = text.split('\n').find(|line| !line.is_empty())?;
    Some(first.starts_with([' ', '\t']))
}

/// `text` as a literal block scalar whose header goes on the current line and whose content
/// is indented two columns past `indent`, the column of the collection holding it.
fn literal(out: &mut String, text: &str, indent: usize) {
    let body = text.trim_end_matches('\n');
    let trailing_breaks = text.len() - body.len();
    out.push('|');
    if literal_block(text) == Some(true) {
        out.push('2');
    }
    match trailing_breaks {
        0 => out.push('-'),
        1 => {}
        _ => out.push('+'),
    }
    out.push('\n');
    for line in body.split('\n') {
        if !line.is_empty() {
            pad(out, indent + 2);
            out.push_str(line);
        }
        out.push('\n');
    }
    for _ in 1..trailing_breaks {
        out.push('\n');
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    /// What podmend's own reader makes of `yaml`.
    fn read_back(yaml: &str) -> Value {
        serde_yaml_ng::from_str(yaml).unwrap_or_else(|e| panic!("{e}:\n{yaml}"))
    }

    /// Strings every reader would take for something else, or that plain style cannot carry.
    #[rustfmt::skip]
    const TRICKY: &[&str] = &[
        // YAML 1.1 booleans and null, and the 1.2 core ones
        "y", "Y", "yes", "Yes", "YES", "n", "N", "no", "No", "NO", "true", "True", "TRUE",
        "false", "False", "FALSE", "on", "On", "ON", "off", "Off", "OFF", "null", "Null",
        "NULL", "~", "",
        // integers: signs, bases, legacy octal, underscores, sexagesimal
        "0", "1", "-1", "+1", "007", "0777", "0o17", "0x1F", "0X1f", "0b1010", "-0b1",
        "1_000", "+1_000", "-_1", "_1", "1:20", "190:20:30", "-1:20",
        // floats
        "1.0", "1.", ".5", "-.5", "1e3", "1E3", "1.0e+3", "6.8523015e+5", "1_000.5",
        "190:20:30.15", ".inf", "-.Inf", "+.INF", ".nan", ".NaN", ".NAN", "0.1",
        // timestamps
        "2001-12-14", "2001-12-14t21:59:43.10-05:00", "2001-12-14 21:59:43.10 -5",
        "2001-12-15T02:59:43.1Z",
        // merge and value keys
        "<<", "=",
        // indicators and comments
        "- a", "-", "? a", "?", ": a", ":", "a:", "a: b", "a #b", "#a", "[a]", "{a}",
        "&a", "*a", "!a", "!!str", "|", ">", "'a", "\"a", "%a", "@a", "`a", "---", "...",
        "--- a", "... a",
        // whitespace and control characters
        " a", "a ", "a\tb", "\t", "a\rb", "a\r\nb", "\u{85}", "a\u{2028}b", "\u{2029}",
        "\u{FEFF}a", "\u{0}", "\u{7}", "\u{1B}[0m", "\u{7F}", "\u{9F}", "\u{FFFE}",
        // multi-line text
        "a\nb", "a\nb\n", "a\nb\n\n", "\na", "\n\na\n", " a\nb", "\ta\nb", "a\n b", "a \nb",
        "a\n\nb", "\n", "\n\n", "a\n  \nb", "#!/bin/sh\nset -e\necho \"$1: done\" # ok\n",
        "a\n---\nb", "a\n...\n",
        // quotes, and characters outside ASCII
        "'", "''", "\"", "é", "日本", "😀",
    ];

    /// Plain, and read back as written.
    const PLAIN_WITH_QUOTES: &[&str] = &["it's", "a'b'", "say \"hi\"", "\\", "a\\nb"];

    /// Strings that stay plain: what Kubernetes objects mostly hold.
    const PLAIN: &[&str] = &[
        "nginx",
        "busybox:1.36",
        "100m",
        "256Mi",
        "2Gi",
        "10.244.0.0/16",
        "http://jenkins:8080/job/a%20b/",
        "--bind-address=127.0.0.1",
        "--controllers=*,bootstrapsigner",
        "kubernetes.io/os",
        "app.kubernetes.io/name",
        "IfNotPresent",
        "-inf",
        "yesterday",
        "a b",
        "a:b",
        "a#b",
        "a,b",
        "Always",
    ];

    #[test]
    fn every_tricky_string_reads_back_as_the_same_string_as_value_and_as_key() {
        for text in TRICKY.iter().chain(PLAIN_WITH_QUOTES).chain(PLAIN) {
            let mut map = Map::new();
            map.insert((*text).to_string(), json!(text));
            let value = json!({"value": text, "key": map, "list": [text, {"x": text}]});
            let yaml = to_string(&value);
            assert_eq!(read_back(&yaml), value, "{text:?} as\n{yaml}");
        }
    }

    #[test]
    fn strings_some_reader_resolves_are_quoted() {
        for text in TRICKY.iter().filter(|t| !t.contains('\n')) {
            let yaml = to_string(&json!({ "k": text }));
            assert!(
                yaml.starts_with("k: '") || yaml.starts_with("k: \""),
                "{text:?} was not quoted: {yaml}"
            );
        }
    }

    #[test]
    fn ordinary_strings_stay_plain() {
        for text in PLAIN.iter().chain(PLAIN_WITH_QUOTES) {
            assert_eq!(to_string(&json!({ "k": text })), format!("k: {text}\n"));
        }
    }

    #[test]
    fn the_mysql_yes_is_quoted() {
        let yaml =
            to_string(&json!({"env": [{"name": "MYSQL_RANDOM_ROOT_PASSWORD", "value": "yes"}]}));
        assert_eq!(
            yaml,
            "env:\n- name: MYSQL_RANDOM_ROOT_PASSWORD\n  value: 'yes'\n"
        );
    }

    #[test]
    fn numbers_are_written_so_yaml_1_1_reads_the_same_number() {
        for (number, text) in [
            (json!(0), "0"),
            (json!(-7), "-7"),
            (json!(u64::MAX), "18446744073709551615"),
            (json!(i64::MIN), "-9223372036854775808"),
            (json!(0.1), "0.1"),
            (json!(100.0), "100.0"),
            (json!(-0.0), "-0.0"),
            (json!(1e100), "1.0e+100"),
            (json!(1.5e-7), "1.5e-7"),
            (json!(f64::MAX), "1.7976931348623157e+308"),
            (json!(5e-324), "5.0e-324"),
        ] {
            let yaml = to_string(&json!({ "number": number }));
            assert_eq!(yaml, format!("number: {text}\n"));
            assert_eq!(read_back(&yaml), json!({ "number": number }), "{yaml}");
        }
    }

    #[test]
    fn multi_line_strings_are_literal_blocks_with_the_right_chomping() {
        for (text, yaml) in [
            ("a\nb", "k: |-\n  a\n  b\n"),
            ("a\nb\n", "k: |\n  a\n  b\n"),
            ("a\nb\n\n", "k: |+\n  a\n  b\n\n"),
            ("a\n\nb", "k: |-\n  a\n\n  b\n"),
            (" a\nb", "k: |2-\n   a\n  b\n"),
            ("\n\n a\n", "k: |2\n\n\n   a\n"),
        ] {
            assert_eq!(to_string(&json!({ "k": text })), yaml, "{text:?}");
        }
        assert_eq!(
            to_string(&json!({"args": ["-c", "set -e\necho hi\n"]})),
            "args:\n- -c\n- |\n  set -e\n  echo hi\n"
        );
        assert_eq!(
            to_string(&json!([{"a": {"b": "x\ny"}}])),
            "- a:\n    b: |-\n      x\n      y\n"
        );
    }

    #[test]
    fn what_a_literal_block_cannot_carry_is_double_quoted() {
        for (text, yaml) in [
            ("a \nb", "k: \"a \\nb\"\n"),
            ("a\r\nb", "k: \"a\\r\\nb\"\n"),
            ("a\n  \nb", "k: \"a\\n  \\nb\"\n"),
            ("\n", "k: \"\\n\"\n"),
            ("a\u{2028}b\n", "k: \"a\\Lb\\n\"\n"),
            ("\u{7}\u{9F}\u{FFFE}", "k: \"\\x07\\x9F\\uFFFE\"\n"),
        ] {
            assert_eq!(to_string(&json!({ "k": text })), yaml, "{text:?}");
        }
    }

    #[test]
    fn the_layout_is_serde_yaml_ng_s() {
        let value = json!({
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "p", "labels": {"app": "a"}, "annotations": {}},
            "spec": {
                "containers": [{"name": "c", "args": [], "ports": [{"containerPort": 80}]}],
                "nested": [[1, 2], [], [{"a": null}]],
                "enabled": true,
                "medium": "",
                "cpu": "0",
            },
        });
        let ours = to_string(&value);
        assert_eq!(ours, serde_yaml_ng::to_string(&value).expect("yaml"));
        assert_eq!(read_back(&ours), value);
    }

    #[test]
    fn a_key_too_long_for_an_implicit_key_is_explicit() {
        let long = "k".repeat(2000);
        let value = json!({
            long.clone(): {"a": 1, "b": [1]},
            "list": [{long.clone(): [true, "x\ny"]}],
            "s": {long.clone(): "v"},
        });
        let yaml = to_string(&value);
        assert!(
            yaml.starts_with(&format!("? {long}\n: a: 1\n  b:\n  - 1\n")),
            "{yaml}"
        );
        assert_eq!(read_back(&yaml), value);
    }

    #[test]
    fn documents_that_are_not_mappings_still_read_back() {
        for value in [
            json!(null),
            json!("yes"),
            json!("a\nb"),
            json!(1.5),
            json!([]),
            json!({}),
            json!(["on", ["off"]]),
        ] {
            assert_eq!(read_back(&to_string(&value)), value, "{value}");
        }
    }
}
