//! `ControlClient`: the CLI side of the control socket. One connection carries any
//! number of request/response pairs; each call waits at most the client's timeout.

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::protocol::{
    decode_response, encode_request, ProtocolError, Request, Response, LINE_BYTES_MAX,
};

/// How long a call waits for its answer unless told otherwise.
pub const CALL_TIMEOUT_DEFAULT: Duration = Duration::from_secs(30);

/// Errors talking to the daemon.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// No socket, or a socket nobody listens on.
    #[error("makod is not running (no socket at {}); start it with `mako up`", socket.display())]
    NotRunning {
        /// The socket that was tried.
        socket: PathBuf,
    },
    /// Connecting, sending or receiving failed.
    #[error("control socket {}: cannot {action}: {cause}; check makod.log next to the socket", socket.display())]
    Io {
        socket: PathBuf,
        action: &'static str,
        cause: std::io::Error,
    },
    /// No answer in time.
    #[error(
        "makod did not answer `{request}` within {} s (socket {}); it may be busy or hung: \
         look at makod.log and `mako diag waiters`",
        timeout.as_secs(), socket.display()
    )]
    Timeout {
        socket: PathBuf,
        request: &'static str,
        timeout: Duration,
    },
    /// The daemon closed the connection without answering (it exited or crashed).
    #[error("makod closed the control connection without answering `{request}` (socket {}); look at makod.log", socket.display())]
    Closed {
        socket: PathBuf,
        request: &'static str,
    },
    /// The answer could not be read.
    #[error("{0}")]
    Protocol(#[from] ProtocolError),
}

/// A connection to `makod`'s control socket.
#[derive(Debug)]
pub struct ControlClient {
    socket: PathBuf,
    reader: BufReader<UnixStream>,
    writer: UnixStream,
    timeout: Duration,
}

impl ControlClient {
    /// Connects to the socket; `ClientError::NotRunning` if no daemon listens there.
    pub fn connect(socket_path: &Path) -> Result<Self, ClientError> {
        let socket = socket_path.to_path_buf();
        let stream = match UnixStream::connect(socket_path) {
            Ok(stream) => stream,
            Err(cause)
                if matches!(
                    cause.kind(),
                    std::io::ErrorKind::NotFound | std::io::ErrorKind::ConnectionRefused
                ) =>
            {
                return Err(ClientError::NotRunning { socket })
            }
            Err(cause) => {
                return Err(ClientError::Io {
                    socket,
                    action: "connect",
                    cause,
                })
            }
        };
        let writer = stream.try_clone().map_err(|cause| ClientError::Io {
            socket: socket.clone(),
            action: "clone the connection",
            cause,
        })?;
        Ok(ControlClient {
            socket,
            reader: BufReader::new(stream),
            writer,
            timeout: CALL_TIMEOUT_DEFAULT,
        })
    }

    /// Sets how long each later call waits for its answer.
    pub fn set_timeout(&mut self, timeout: Duration) {
        self.timeout = timeout.max(Duration::from_millis(1));
    }

    /// The socket this client is connected to.
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// Sends `request` and waits for its response.
    pub fn call(&mut self, request: &Request) -> Result<Response, ClientError> {
        let io = |action: &'static str, socket: &Path| {
            let socket = socket.to_path_buf();
            move |cause| ClientError::Io {
                socket,
                action,
                cause,
            }
        };
        let mut line = encode_request(request);
        line.push('\n');
        self.writer
            .set_write_timeout(Some(self.timeout))
            .map_err(io("set a timeout", &self.socket))?;
        self.writer
            .write_all(line.as_bytes())
            .map_err(io("send the request", &self.socket))?;
        self.reader
            .get_ref()
            .set_read_timeout(Some(self.timeout))
            .map_err(io("set a timeout", &self.socket))?;
        let mut answer = Vec::new();
        let read = (&mut self.reader)
            .take(LINE_BYTES_MAX as u64 + 1)
            .read_until(b'\n', &mut answer);
        match read {
            Ok(0) => Err(ClientError::Closed {
                socket: self.socket.clone(),
                request: request.name(),
            }),
            Ok(_) if !answer.ends_with(b"\n") => {
                if answer.len() > LINE_BYTES_MAX {
                    Err(ProtocolError::Malformed {
                        detail: format!("response longer than {LINE_BYTES_MAX} bytes"),
                    }
                    .into())
                } else {
                    Err(ClientError::Closed {
                        socket: self.socket.clone(),
                        request: request.name(),
                    })
                }
            }
            Ok(_) => {
                let text = String::from_utf8_lossy(&answer);
                Ok(decode_response(&text)?)
            }
            Err(cause)
                if matches!(
                    cause.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                Err(ClientError::Timeout {
                    socket: self.socket.clone(),
                    request: request.name(),
                    timeout: self.timeout,
                })
            }
            Err(cause) => Err(ClientError::Io {
                socket: self.socket.clone(),
                action: "read the response",
                cause,
            }),
        }
    }
}
