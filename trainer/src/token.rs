//! Unguessable tokens: a run's report secret, unique names for staged
//! checkpoint parts.

/// 32 hex digits from the operating system's random source (through `rand`'s
/// thread generator, a CSPRNG seeded from it).
pub(crate) fn random_token() -> String {
    let bytes: [u8; 16] = rand::random();
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// A launch's name in job names, file names and logs: 8 hex digits of its
/// own, never a part of the token (which those show to everyone).
pub(crate) fn run_key() -> String {
    let bytes: [u8; 4] = rand::random();
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Whether two secrets are equal, compared in time that depends on their
/// length only (tokens have a fixed length): every byte is looked at.
pub fn secrets_equal(a: &str, b: &str) -> bool {
    a.len() == b.len() && a.bytes().zip(b.bytes()).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    #[test]
    fn secrets_compare_equal_only_when_equal() {
        assert!(super::secrets_equal("abc", "abc"));
        assert!(!super::secrets_equal("abc", "abd"));
        assert!(!super::secrets_equal("abc", "abcd"));
        assert!(super::secrets_equal("", ""));
    }

    #[test]
    fn tokens_are_32_hex_digits_and_differ() {
        let (a, b) = (super::random_token(), super::random_token());
        assert_eq!(a.len(), 32);
        assert!(a.chars().all(|c| c.is_ascii_hexdigit()));
        assert_ne!(a, b);
    }
}
