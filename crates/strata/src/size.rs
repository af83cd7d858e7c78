//! Parsing and printing byte sizes: `10GiB`, `10G`, `512M`, `4096`.
//!
//! K, M, G, T and P are powers of 1024 with or without `iB` (or `B`), as
//! qemu-img reads them: disk sizes are binary. Case does not matter.

/// Parses a size option, naming it in the error.
pub fn size_option(option: &str, value: &str) -> anyhow::Result<u64> {
    parse_size(value).map_err(|e| anyhow::anyhow!("{option}: {e}"))
}

/// Parses a size; the error says what is accepted.
pub fn parse_size(input: &str) -> Result<u64, String> {
    let s = input.trim();
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (digits, unit) = s.split_at(split);
    let bad = || {
        format!("invalid size {input:?}: expected a number with an optional unit K, M, G, T or P (powers of 1024; KiB, MiB... also accepted), e.g. 10GiB")
    };
    if digits.is_empty() {
        return Err(bad());
    }
    let n: u64 = digits.parse().map_err(|_| bad())?;
    let shift = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 0,
        "k" | "kb" | "kib" => 10,
        "m" | "mb" | "mib" => 20,
        "g" | "gb" | "gib" => 30,
        "t" | "tb" | "tib" => 40,
        "p" | "pb" | "pib" => 50,
        _ => return Err(bad()),
    };
    n.checked_mul(1u64 << shift)
        .ok_or_else(|| format!("size {input:?} is too large"))
}

/// Binary units, largest first, and their shifts.
const UNITS: [(&str, u32); 5] = [
    ("PiB", 50),
    ("TiB", 40),
    ("GiB", 30),
    ("MiB", 20),
    ("KiB", 10),
];

/// `10 GiB`, `512 MiB`, `1000 B`: the largest unit that divides exactly.
pub fn format_size(bytes: u64) -> String {
    for (name, shift) in UNITS {
        if bytes >= (1 << shift) && bytes.is_multiple_of(1 << shift) {
            return format!("{} {name}", bytes >> shift);
        }
    }
    format!("{bytes} B")
}

/// `bytes` for people, rounded: "412.3 MiB", "1.0 GiB", "812 B" (for
/// progress figures that are rarely whole units).
pub fn approx_size(bytes: u64) -> String {
    for (name, shift) in UNITS {
        if bytes >= (1 << shift) {
            return format!("{:.1} {name}", bytes as f64 / (1u64 << shift) as f64);
        }
    }
    format!("{bytes} B")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn approx_sizes_round_to_one_decimal() {
        assert_eq!(approx_size(812), "812 B");
        assert_eq!(approx_size(1 << 30), "1.0 GiB");
        assert_eq!(approx_size(412 * (1 << 20) + (3 << 20) / 10), "412.3 MiB");
    }

    #[test]
    fn parses_units_with_and_without_ib() {
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("10GiB"), Ok(10 << 30));
        assert_eq!(parse_size("10G"), Ok(10 << 30));
        assert_eq!(parse_size("10g"), Ok(10 << 30));
        assert_eq!(parse_size("512M"), Ok(512 << 20));
        assert_eq!(parse_size("1T"), Ok(1 << 40));
        assert_eq!(parse_size("64KiB"), Ok(64 << 10));
        assert_eq!(parse_size("2 MiB"), Ok(2 << 20));
        for bad in ["", "G", "10X", "-1", "1.5G", "10GiBs", "99999999999P"] {
            assert!(parse_size(bad).is_err(), "{bad:?}");
        }
        assert_eq!(format_size(10 << 30), "10 GiB");
        assert_eq!(format_size(1000), "1000 B");
    }
}
