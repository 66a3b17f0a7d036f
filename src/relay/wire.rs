//! The relay's greeting: the one line a relay sends on a fresh TLS connection before
//! anything else, and the gateway's one-line answer.
//!
//! ```text
//! relay   → gateway   TGR1 stream <credential>\n     (or `control`, or `wait`)
//! gateway → relay     OK\n                           (or `NO <reason>\n`, then close)
//!                     GO <ip:port>\n                 (the session runs there: dial it)
//! ```
//!
//! `wait` is a parked pod's relay (presenting its pod's token) asking to be told of its
//! pod's adoption: the gateway holds the line unanswered until the pod is adopted
//! (`OK`, then close) or for at most [`ADOPTION_WAIT_HOLD`] (`NO not_adopted`: ask
//! again). One wait per pod: a second takes the first one's place (`NO superseded`).
//!
//! After `OK` the connection is HTTP/1.1: for `stream`, the agent's own bytes, served by
//! the session's router exactly as its unix socket serves them; for `control`, the
//! relay's own requests (`relay::control`). The relay sends nothing after its line until
//! it has read the answer, so neither side reads past a line. A line is at most
//! [`MAX_LINE`] bytes; a longer one is refused unread.

use tokio::io::{AsyncBufRead, AsyncBufReadExt as _, AsyncReadExt as _};

use super::credential::MAX_CREDENTIAL_LEN;
use crate::sandbox::MAX_POD_TOKEN_LEN;
use crate::secrets::{ExposeSecret as _, SecretString};

/// The longest greeting or answer line, newline included: room for a minted credential
/// or a pod's service-account token.
pub const MAX_LINE: usize = if MAX_CREDENTIAL_LEN > MAX_POD_TOKEN_LEN {
    MAX_CREDENTIAL_LEN
} else {
    MAX_POD_TOKEN_LEN
} + 32;
const VERSION: &str = "TGR1";
/// The longest the gateway holds a `wait` before answering `NO not_adopted`; the relay
/// then asks again, so a lost wake-up delays an adoption by at most this long.
pub const ADOPTION_WAIT_HOLD: std::time::Duration = std::time::Duration::from_secs(25);

/// What a relayed connection is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Purpose {
    /// The agent's connection, piped: served by the session's router.
    Stream,
    /// The relay's own: renewing its credential, fetching the session's secrets.
    Control,
    /// A parked pod's relay waiting for its pod's adoption: one answer line, no HTTP.
    Wait,
}

impl Purpose {
    fn as_str(self) -> &'static str {
        match self {
            Purpose::Stream => "stream",
            Purpose::Control => "control",
            Purpose::Wait => "wait",
        }
    }
}

/// Why the gateway refused a connection: the word after `NO`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, strum::IntoStaticStr, strum::EnumString)]
#[strum(serialize_all = "snake_case")]
pub enum Refused {
    /// The greeting was not one.
    Malformed,
    /// The credential is not authentic.
    Invalid,
    /// The credential has expired.
    Expired,
    /// The session is not running (stopped, or not started on this gateway).
    Stopped,
    /// The session has as many relayed connections open as it may.
    Busy,
    /// The credential cannot be checked now (a pod token, and the API server that
    /// reviews it cannot be reached): refused, try again later.
    Unavailable,
    /// A `wait`: the pod was not adopted within [`ADOPTION_WAIT_HOLD`]; ask again.
    NotAdopted,
    /// A `wait` another wait for the same pod took the place of.
    Superseded,
}

impl Refused {
    /// The word on the wire.
    pub fn as_str(self) -> &'static str {
        self.into()
    }
}

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The greeting line for `purpose` with `credential`.
pub fn greeting(purpose: Purpose, credential: &SecretString) -> SecretString {
    SecretString::from(format!(
        "{VERSION} {} {}\n",
        purpose.as_str(),
        credential.expose_secret()
    ))
}

/// The gateway's answer line.
pub fn answer(outcome: Result<(), Refused>) -> String {
    match outcome {
        Ok(()) => "OK\n".to_owned(),
        Err(why) => format!("NO {why}\n"),
    }
}

/// Reads one line of at most [`MAX_LINE`] bytes, without its newline. `None` when the
/// peer closed, sent a longer line, or sent bytes that are not UTF-8.
pub async fn read_line<R: AsyncBufRead + Unpin>(reader: &mut R) -> std::io::Result<Option<String>> {
    let mut line = Vec::with_capacity(128);
    let limit = u64::try_from(MAX_LINE).unwrap_or(u64::MAX);
    (&mut *reader)
        .take(limit)
        .read_until(b'\n', &mut line)
        .await?;
    if line.pop() != Some(b'\n') {
        zeroize::Zeroize::zeroize(&mut line);
        return Ok(None);
    }
    Ok(String::from_utf8(line).ok())
}

/// Parses a greeting: its purpose and credential, or `None` when it is not one.
pub fn parse_greeting(line: String) -> Option<(Purpose, SecretString)> {
    let line = SecretString::from(line);
    let mut parts = line.expose_secret().split(' ');
    let (Some(VERSION), Some(purpose), Some(credential), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return None;
    };
    let purpose = match purpose {
        "stream" => Purpose::Stream,
        "control" => Purpose::Control,
        "wait" => Purpose::Wait,
        _ => return None,
    };
    Some((purpose, SecretString::from(credential.to_owned())))
}

/// The gateway's answer sending the relay to `addr` (its session's owner).
pub fn redirect(addr: std::net::SocketAddr) -> String {
    format!("GO {addr}\n")
}

/// The address of a redirect answer line, if it is one.
pub fn parse_redirect(line: &str) -> Option<std::net::SocketAddr> {
    line.strip_prefix("GO ")?.parse().ok()
}

/// Parses the gateway's answer line.
pub fn parse_answer(line: &str) -> Option<Result<(), Refused>> {
    if line == "OK" {
        return Some(Ok(()));
    }
    let why = line.strip_prefix("NO ")?;
    why.parse().ok().map(Err)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_greeting_reads_back_and_a_long_line_is_refused() {
        let credential = SecretString::from("tgr1.s1.5.n.m".to_owned());
        let line = greeting(Purpose::Control, &credential);
        let mut reader = tokio::io::BufReader::new(line.expose_secret().as_bytes());
        let read = read_line(&mut reader).await.expect("io").expect("a line");
        let (purpose, back) = parse_greeting(read).expect("a greeting");
        assert_eq!(purpose, Purpose::Control);
        assert_eq!(back.expose_secret(), "tgr1.s1.5.n.m");

        let long = format!("TGR1 stream {}\n", "a".repeat(MAX_LINE));
        let mut reader = tokio::io::BufReader::new(long.as_bytes());
        assert_eq!(read_line(&mut reader).await.expect("io"), None);
        let mut closed = tokio::io::BufReader::new(&b"TGR1 stream x"[..]);
        assert_eq!(read_line(&mut closed).await.expect("io"), None);

        let (purpose, _) = parse_greeting("TGR1 wait x".to_owned()).expect("a wait");
        assert_eq!(purpose, Purpose::Wait);
        for bad in [
            "TGR2 stream x",
            "TGR1 other x",
            "TGR1 stream",
            "TGR1 stream x y",
        ] {
            assert!(parse_greeting(bad.to_owned()).is_none(), "{bad}");
        }
    }

    #[test]
    fn answers_read_back() {
        for outcome in [
            Ok(()),
            Err(Refused::Expired),
            Err(Refused::Busy),
            Err(Refused::NotAdopted),
            Err(Refused::Superseded),
        ] {
            let line = answer(outcome);
            assert_eq!(parse_answer(line.trim_end()), Some(outcome));
        }
        assert_eq!(parse_answer("NO what"), None);
        let owner: std::net::SocketAddr = "10.0.3.7:8443".parse().expect("addr");
        let line = redirect(owner);
        assert_eq!(parse_redirect(line.trim_end()), Some(owner));
        assert_eq!(parse_answer(line.trim_end()), None);
        assert_eq!(parse_redirect("GO threadgate.example:1"), None);
        assert_eq!(parse_redirect("OK"), None);
        assert_eq!(parse_answer("HTTP/1.1 200 OK"), None);
    }
}
