//! Kubernetes resource quantities (`"500m"`, `"1.5Gi"`, `"2e3"`), parsed exactly into
//! milli-units the way `resource.Quantity.MilliValue()` reports them (rounded up).
//!
//! k8s-openapi keeps a quantity as the string the user wrote; the rules need to compare
//! them and compute LimitRange floors, so this is the one place that understands them.

/// A quantity in milli-units (1 cpu = 1000, 1 byte of memory = 1000).
pub type Milli = i128;

/// Parses a quantity into milli-units, rounding a fraction of a milli-unit up (as
/// `MilliValue()` does). `None` when the string is not a valid quantity or overflows.
pub fn parse_milli(text: &str) -> Option<Milli> {
    let text = text.trim();
    let (negative, rest) = match text.as_bytes().first()? {
        b'-' => (true, &text[1..]),
        b'+' => (false, &text[1..]),
        _ => (false, text),
    };
    let number_end = rest
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(rest.len());
    let (number, suffix) = rest.split_at(number_end);
    let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
    if whole.is_empty() && fraction.is_empty() {
        return None;
    }
    if fraction.contains('.') {
        return None;
    }
    let mut mantissa: i128 = 0;
    for digit in whole.bytes().chain(fraction.bytes()) {
        mantissa = mantissa
            .checked_mul(10)?
            .checked_add(i128::from(digit - b'0'))?;
    }
    let scale = Scale::from_suffix(suffix)?;
    // value = mantissa * 10^-fraction_digits * scale; in milli-units multiply by 1000.
    let mut numerator = mantissa.checked_mul(1000)?;
    let mut denominator: i128 = 10i128.checked_pow(u32::try_from(fraction.len()).ok()?)?;
    match scale {
        Scale::Binary(power) => numerator = numerator.checked_mul(1i128.checked_shl(power)?)?,
        Scale::Decimal(exponent) if exponent >= 0 => {
            numerator = numerator.checked_mul(10i128.checked_pow(exponent.unsigned_abs())?)?
        }
        Scale::Decimal(exponent) => {
            denominator = denominator.checked_mul(10i128.checked_pow(exponent.unsigned_abs())?)?
        }
    }
    let milli = numerator.checked_add(denominator - 1)? / denominator;
    Some(if negative { -milli } else { milli })
}

/// True when the quantity parses and equals zero.
pub fn is_zero(text: &str) -> bool {
    parse_milli(text) == Some(0)
}

/// Formats milli-units as a canonical quantity: whole units when exact, else `"<n>m"`.
pub fn format_milli(milli: Milli) -> String {
    if milli % 1000 == 0 {
        (milli / 1000).to_string()
    } else {
        format!("{milli}m")
    }
}

/// Formats milli-units rounded up to whole units (for byte quantities such as memory).
pub fn format_whole_units_up(milli: Milli) -> String {
    (milli.div_euclid(1000) + i128::from(milli.rem_euclid(1000) != 0)).to_string()
}

enum Scale {
    Binary(u32),
    Decimal(i32),
}

impl Scale {
    fn from_suffix(suffix: &str) -> Option<Self> {
        Some(match suffix {
            "" => Scale::Decimal(0),
            "n" => Scale::Decimal(-9),
            "u" => Scale::Decimal(-6),
            "m" => Scale::Decimal(-3),
            "k" => Scale::Decimal(3),
            "M" => Scale::Decimal(6),
            "G" => Scale::Decimal(9),
            "T" => Scale::Decimal(12),
            "P" => Scale::Decimal(15),
            "E" => Scale::Decimal(18),
            "Ki" => Scale::Binary(10),
            "Mi" => Scale::Binary(20),
            "Gi" => Scale::Binary(30),
            "Ti" => Scale::Binary(40),
            "Pi" => Scale::Binary(50),
            "Ei" => Scale::Binary(60),
            exponent => {
                let digits = exponent
                    .strip_prefix('e')
                    .or_else(|| exponent.strip_prefix('E'))?;
                let unsigned = digits.strip_prefix(['+', '-']).unwrap_or(digits);
                if unsigned.is_empty() || !unsigned.bytes().all(|b| b.is_ascii_digit()) {
                    return None;
                }
                let value: i32 = digits.parse().ok()?;
                if !(-30..=30).contains(&value) {
                    return None;
                }
                Scale::Decimal(value)
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantities_in_every_notation_parse_to_milli_units() {
        let cases: &[(&str, Milli)] = &[
            ("0", 0),
            ("0m", 0),
            ("0.0", 0),
            ("100m", 100),
            ("1", 1000),
            ("1.5", 1500),
            (".5", 500),
            ("2k", 2_000_000),
            ("1Ki", 1_024_000),
            ("32Mi", 32 * 1024 * 1024 * 1000),
            ("1Gi", 1024 * 1024 * 1024 * 1000),
            ("1e3", 1_000_000),
            ("1E3", 1_000_000),
            ("1E", 1_000_000_000_000_000_000_000),
            ("1e-3", 1),
            ("250u", 1),
            ("1n", 1),
            ("-1", -1000),
            ("256Mi", 256 * 1024 * 1024 * 1000),
        ];
        for (text, milli) in cases {
            assert_eq!(parse_milli(text), Some(*milli), "{text}");
        }
    }

    #[test]
    fn malformed_quantities_are_rejected() {
        for text in [
            "", "m", "1x", "1.2.3", "1Kib", "e3", "1e", "1e+", "--1", "1 Gi",
        ] {
            assert_eq!(parse_milli(text), None, "{text:?}");
        }
    }

    #[test]
    fn zero_is_recognised_in_any_spelling() {
        assert!(is_zero("0"));
        assert!(is_zero("0Mi"));
        assert!(!is_zero("1m"));
        assert!(!is_zero("garbage"));
    }

    #[test]
    fn milli_units_format_back_to_short_quantities() {
        assert_eq!(format_milli(100), "100m");
        assert_eq!(format_milli(2000), "2");
        assert_eq!(format_whole_units_up(1), "1");
        assert_eq!(format_whole_units_up(3000), "3");
        assert_eq!(format_whole_units_up(3001), "4");
    }
}
