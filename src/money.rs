//! Amounts of money as people read and type them ("25.00 USD") and as providers take
//! them (2500, in the currency's smallest unit), converted exactly: no floating point
//! anywhere, and an amount a currency cannot express is an error, never rounded.
//!
//! A call's `amount` is money when the call also names its `currency` (the gateway
//! completes a refund's currency from its charge); any other whole number is a count.

use serde_json::Value;

/// Currencies without a minor unit (Stripe's zero-decimal list): 1000 JPY is 1000.
const ZERO_DECIMAL: [&str; 16] = [
    "bif", "clp", "djf", "gnf", "jpy", "kmf", "krw", "mga", "pyg", "rwf", "ugx", "vnd", "vuv",
    "xaf", "xof", "xpf",
];

/// Currencies with three decimals (Stripe's three-decimal list): 1000 KWD minor is 1.000.
const THREE_DECIMAL: [&str; 5] = ["bhd", "jod", "kwd", "omr", "tnd"];

/// An ISO 4217 currency code, three ASCII letters, kept lowercase (as Stripe writes it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Currency(String);

/// Why a typed amount was not accepted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MoneyError {
    /// Not a plain decimal number.
    #[error("{text:?} is not an amount: write it like 25.00 ({code})")]
    NotANumber {
        /// What was typed.
        text: String,
        /// The currency, uppercase.
        code: String,
    },
    /// More decimals than the currency has.
    #[error("{text:?} has more decimals than {code} has ({decimals})")]
    TooPrecise {
        /// What was typed.
        text: String,
        /// The currency, uppercase.
        code: String,
        /// The currency's decimals.
        decimals: u32,
    },
    /// Too large to be an amount.
    #[error("{text:?} is too large an amount")]
    TooLarge {
        /// What was typed.
        text: String,
    },
}

impl Currency {
    /// The currency named by `code` (any case), if it is three ASCII letters.
    pub fn parse(code: &str) -> Option<Currency> {
        (code.len() == 3 && code.bytes().all(|b| b.is_ascii_alphabetic()))
            .then(|| Currency(code.to_ascii_lowercase()))
    }

    /// The currency a call's arguments name in `currency`, if any.
    pub fn of_args(args: &Value) -> Option<Currency> {
        args.get("currency")
            .and_then(Value::as_str)
            .and_then(Currency::parse)
    }

    /// The code as people read it: `USD`.
    pub fn code(&self) -> String {
        self.0.to_ascii_uppercase()
    }

    /// How many decimals its smallest unit has.
    pub fn decimals(&self) -> u32 {
        let code = self.0.as_str();
        if ZERO_DECIMAL.contains(&code) {
            0
        } else if THREE_DECIMAL.contains(&code) {
            3
        } else {
            2
        }
    }

    /// `minor` (in the smallest unit) as a decimal without the code: 2500 USD is "25.00".
    pub fn units(&self, minor: i64) -> String {
        let decimals = self.decimals();
        let scale = 10_u64.pow(decimals);
        let sign = if minor < 0 { "-" } else { "" };
        let magnitude = minor.unsigned_abs();
        if decimals == 0 {
            return format!("{sign}{magnitude}");
        }
        let width = decimals as usize;
        format!("{sign}{}.{:0width$}", magnitude / scale, magnitude % scale)
    }

    /// `minor` with its code: 2500 USD is "25.00 USD".
    pub fn format(&self, minor: i64) -> String {
        format!("{} {}", self.units(minor), self.code())
    }

    /// A typed amount in the currency's units ("10", "10.5", "10.50") as the smallest
    /// unit (1050), exactly. A sign, an exponent, separators or more decimals than the
    /// currency has are refused.
    pub fn parse_units(&self, text: &str) -> Result<i64, MoneyError> {
        let typed = text.trim();
        let not_a_number = || MoneyError::NotANumber {
            text: typed.to_owned(),
            code: self.code(),
        };
        let (whole, fraction) = typed.split_once('.').unwrap_or((typed, ""));
        let digits = |s: &str| s.bytes().all(|b| b.is_ascii_digit());
        if whole.is_empty() || !digits(whole) || !digits(fraction) || (typed.ends_with('.')) {
            return Err(not_a_number());
        }
        let decimals = self.decimals();
        if fraction.len() > decimals as usize {
            return Err(MoneyError::TooPrecise {
                text: typed.to_owned(),
                code: self.code(),
                decimals,
            });
        }
        let too_large = || MoneyError::TooLarge {
            text: typed.to_owned(),
        };
        let whole: i64 = whole.parse().map_err(|_| too_large())?;
        let padded = format!("{fraction:0<width$}", width = decimals as usize);
        let fraction: i64 = if padded.is_empty() {
            0
        } else {
            padded.parse().map_err(|_| not_a_number())?
        };
        whole
            .checked_mul(10_i64.pow(decimals))
            .and_then(|n| n.checked_add(fraction))
            .ok_or_else(too_large)
    }
}

/// Whether the argument `name` of `args` is an amount of money (an `amount` beside a
/// `currency`), and in which currency.
pub fn money_arg(args: &Value, name: &str) -> Option<Currency> {
    (name == "amount")
        .then(|| Currency::of_args(args))
        .flatten()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn cur(code: &str) -> Currency {
        Currency::parse(code).expect("code")
    }

    #[test]
    fn amounts_read_in_the_currency_units() {
        let check = |code: &str, minor: i64, shown: &str| {
            assert_eq!(cur(code).format(minor), shown, "{code} {minor}");
        };
        check("usd", 2500, "25.00 USD");
        check("usd", 5, "0.05 USD");
        check("USD", 0, "0.00 USD");
        check("jpy", 1000, "1000 JPY");
        check("kwd", 1500, "1.500 KWD");
        check("eur", -250, "-2.50 EUR");
    }

    #[test]
    fn typed_amounts_convert_exactly_or_are_refused_by_name() {
        let usd = cur("usd");
        assert_eq!(usd.parse_units("10"), Ok(1000));
        assert_eq!(usd.parse_units(" 10.5 "), Ok(1050));
        assert_eq!(usd.parse_units("10.50"), Ok(1050));
        assert_eq!(usd.parse_units("0.01"), Ok(1));
        assert_eq!(cur("jpy").parse_units("1000"), Ok(1000));
        assert_eq!(cur("kwd").parse_units("1.5"), Ok(1500));
        assert!(matches!(
            usd.parse_units("10.005"),
            Err(MoneyError::TooPrecise { decimals: 2, .. })
        ));
        assert!(matches!(
            cur("jpy").parse_units("10.5"),
            Err(MoneyError::TooPrecise { decimals: 0, .. })
        ));
        for bad in ["", ".5", "10.", "-1", "+1", "1e3", "1,000", "ten", "1.2.3"] {
            assert!(
                matches!(usd.parse_units(bad), Err(MoneyError::NotANumber { .. })),
                "{bad:?}"
            );
        }
        assert!(matches!(
            usd.parse_units("99999999999999999999"),
            Err(MoneyError::TooLarge { .. })
        ));
        let message = usd.parse_units("10.005").unwrap_err().to_string();
        assert!(
            message.contains("USD") && message.contains("10.005"),
            "{message}"
        );
    }

    #[test]
    fn only_an_amount_beside_a_currency_is_money() {
        let refund = serde_json::json!({"amount": 2500, "currency": "usd", "quantity": 3});
        assert_eq!(money_arg(&refund, "amount"), Some(cur("usd")));
        assert_eq!(money_arg(&refund, "quantity"), None);
        assert_eq!(
            money_arg(&serde_json::json!({"amount": 2500}), "amount"),
            None
        );
        assert_eq!(Currency::parse("us"), None);
        assert_eq!(Currency::parse("u$d"), None);
    }

    proptest! {
        #[test]
        fn what_is_shown_parses_back_to_the_same_amount(minor in 0i64..i64::MAX / 1000, code in prop::sample::select(vec!["usd", "jpy", "kwd", "eur"])) {
            let c = cur(code);
            prop_assert_eq!(c.parse_units(&c.units(minor)), Ok(minor));
        }
    }
}
