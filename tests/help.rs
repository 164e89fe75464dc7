//! `--help` is read on a terminal: every command's help, found by walking the "Commands:"
//! lists of the real binary from the top, is plain text with no rustdoc or Markdown markup.

use std::process::Command;

const PODMEND: &str = env!("CARGO_BIN_EXE_podmend");

/// Markup that means a doc comment was written for rustdoc, not for the terminal.
const MARKUP: &[&str] = &[
    "[`", "`]", "](", "`", "fn@", "struct@", "enum@", "crate::", "Self::",
];

fn help(path: &[&str], flag: &str) -> String {
    let output = Command::new(PODMEND)
        .args(path)
        .arg(flag)
        .output()
        .expect("run podmend");
    assert!(
        output.status.success(),
        "podmend {} {flag} failed: {}",
        path.join(" "),
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).expect("help is UTF-8")
}

/// The subcommands a help text lists under "Commands:" (clap's own `help` left out).
fn subcommands(text: &str) -> Vec<String> {
    text.lines()
        .skip_while(|line| line.trim_end() != "Commands:")
        .skip(1)
        .take_while(|line| line.starts_with("  "))
        .filter_map(|line| line.split_whitespace().next())
        .filter(|name| *name != "help")
        .map(str::to_string)
        .collect()
}

/// Every command path, the top level first.
fn every_command() -> Vec<Vec<String>> {
    let mut found = vec![Vec::new()];
    let mut next = 0;
    while next < found.len() {
        let path = found[next].clone();
        next += 1;
        let args: Vec<&str> = path.iter().map(String::as_str).collect();
        for name in subcommands(&help(&args, "--help")) {
            let mut child = path.clone();
            child.push(name);
            found.push(child);
        }
    }
    found
}

#[test]
fn every_command_has_help_and_the_walk_finds_them_all() {
    let commands: Vec<String> = every_command().iter().map(|path| path.join(" ")).collect();
    for expected in [
        "",
        "serve",
        "audit",
        "clean-storms",
        "guard",
        "guard reap",
        "certs",
        "config",
    ] {
        assert!(
            commands.iter().any(|c| c == expected),
            "podmend {expected} not found: {commands:?}"
        );
    }
}

#[test]
fn help_text_has_no_rustdoc_or_markdown_markup() {
    let mut problems = Vec::new();
    for path in every_command() {
        let args: Vec<&str> = path.iter().map(String::as_str).collect();
        for flag in ["--help", "-h"] {
            let text = help(&args, flag);
            for line in text.lines() {
                if let Some(markup) = MARKUP.iter().find(|m| line.contains(*m)) {
                    problems.push(format!(
                        "podmend {} {flag}: {markup:?} in {line:?}",
                        args.join(" ")
                    ));
                }
            }
        }
    }
    assert!(
        problems.is_empty(),
        "help meant for rustdoc:\n{}",
        problems.join("\n")
    );
}

#[test]
fn the_markup_check_catches_a_rustdoc_link() {
    let line = "- json:  The [`json`](fn@json) document";
    assert!(MARKUP.iter().any(|m| line.contains(m)));
}
