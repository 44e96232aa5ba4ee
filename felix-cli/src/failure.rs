//! Why a command failed, and the exit code that tells a script.

use felix_client::ClientError;

/// A failed command: what to print on stderr and how to exit.
#[derive(Debug)]
pub(crate) enum Failure {
    /// A cache key was absent: exit 1, nothing printed.
    Miss,
    /// Bad arguments or unusable local input (a key file, a CA file): exit 2.
    Usage(String),
    /// The broker refused the request: exit 3.
    Refused(String),
    /// The connection, a timeout, a protocol violation or local I/O: exit 4.
    Connection(String),
    /// The broker ended the subscription (lagged, closed, deleted, moved): exit 5.
    Ended(String),
}

impl Failure {
    pub(crate) fn usage(message: impl Into<String>) -> Failure {
        Failure::Usage(message.into())
    }

    pub(crate) fn io(what: &str, e: std::io::Error) -> Failure {
        Failure::Connection(format!("{what}: {e}"))
    }

    /// A client error, with what the CLI was doing when it happened.
    pub(crate) fn client(what: &str, e: ClientError) -> Failure {
        let message = format!("{what}: {e}");
        match e {
            ClientError::Server { .. }
            | ClientError::Unsupported { .. }
            | ClientError::NotLeader { .. } => Failure::Refused(message),
            // The client would not encode it: an argument the protocol cannot carry.
            ClientError::Usage(_) => Failure::Usage(message),
            ClientError::Connection(_) | ClientError::Protocol(_) | ClientError::Timeout(_) => {
                Failure::Connection(message)
            }
        }
    }

    pub(crate) fn exit_code(&self) -> u8 {
        match self {
            Failure::Miss => 1,
            Failure::Usage(_) => 2,
            Failure::Refused(_) => 3,
            Failure::Connection(_) => 4,
            Failure::Ended(_) => 5,
        }
    }

    pub(crate) fn message(&self) -> Option<&str> {
        match self {
            Failure::Miss => None,
            Failure::Usage(m)
            | Failure::Refused(m)
            | Failure::Connection(m)
            | Failure::Ended(m) => Some(m),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn client_errors_map_to_distinct_exit_codes() {
        let refused = ClientError::Server {
            code: None,
            retry: None,
            message: "forbidden".into(),
        };
        assert_eq!(Failure::client("publish", refused).exit_code(), 3);
        let lost = ClientError::Connection("reset".into());
        assert_eq!(Failure::client("publish", lost).exit_code(), 4);
        assert_eq!(
            Failure::client("publish", ClientError::Timeout("an answer")).exit_code(),
            4
        );
        let bad = ClientError::Usage("name too long".into());
        assert_eq!(Failure::client("publish", bad).exit_code(), 2);
        assert_eq!(Failure::Miss.exit_code(), 1);
        assert!(Failure::Miss.message().is_none());
    }
}
