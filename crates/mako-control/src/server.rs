//! The daemon side of the control socket: `serve` accepts connections on a Unix
//! socket (mode 0600, so only the daemon's user can control it) and answers every
//! request line with the `ControlHandler`.
//!
//! A malformed line, an unknown request, a version mismatch or a panicking handler
//! gets an `Error` response; the connection stays usable and the daemon never panics
//! because of what a client sent.

use std::io::{self, BufRead, BufReader, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use crate::protocol::{decode_request, encode_response, Request, Response, LINE_BYTES_MAX};

/// How often blocked accept and read loops look at the stop flag.
const STOP_POLL_MS: u64 = 100;

/// Answers control requests. Called from one thread per connection, concurrently.
pub trait ControlHandler: Send + Sync {
    /// Handles one request; never fails, a failure is a `Response::Error`.
    fn handle(&self, request: Request) -> Response;
}

/// Listens on `socket_path` until `stop` is set, then removes the socket and returns.
///
/// 1. If a socket file exists and a daemon answers on it, refuse (`AddrInUse`): two
///    daemons must not share a data directory. Otherwise it is stale: remove it.
/// 2. Bind a temporary socket beside it, set mode 0600, rename it into place, so no
///    client ever sees the socket with wider permissions.
/// 3. Accept in a thread; each connection gets its own thread, which stops at the
///    next line boundary (or within `STOP_POLL_MS` when idle) once `stop` is set.
/// 4. On stop, join the connection threads and remove the socket file.
pub fn serve(
    socket_path: &Path,
    handler: Arc<dyn ControlHandler>,
    stop: Arc<AtomicBool>,
) -> io::Result<JoinHandle<()>> {
    // 1.
    if socket_path.exists() {
        if UnixStream::connect(socket_path).is_ok() {
            return Err(io::Error::new(
                io::ErrorKind::AddrInUse,
                format!(
                    "another makod already serves {}; stop it with `mako down` first",
                    socket_path.display()
                ),
            ));
        }
        std::fs::remove_file(socket_path)?;
    }
    // 2.
    let file_name = socket_path
        .file_name()
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "socket path has no name"))?;
    let mut temporary_name = std::ffi::OsString::from(".");
    temporary_name.push(file_name);
    temporary_name.push(format!(".tmp.{}", std::process::id()));
    let temporary = socket_path.with_file_name(temporary_name);
    let _ = std::fs::remove_file(&temporary);
    let listener = UnixListener::bind(&temporary)?;
    let placed = std::fs::set_permissions(&temporary, std::fs::Permissions::from_mode(0o600))
        .and_then(|()| std::fs::rename(&temporary, socket_path));
    if let Err(error) = placed {
        let _ = std::fs::remove_file(&temporary);
        return Err(error);
    }
    listener.set_nonblocking(true)?;
    let socket_path = socket_path.to_path_buf();
    // 3.
    std::thread::Builder::new()
        .name("control-accept".to_string())
        .spawn(move || accept_loop(listener, socket_path, handler, stop))
}

fn accept_loop(
    listener: UnixListener,
    socket_path: PathBuf,
    handler: Arc<dyn ControlHandler>,
    stop: Arc<AtomicBool>,
) {
    let mut connections: Vec<JoinHandle<()>> = Vec::new();
    while !stop.load(Ordering::SeqCst) {
        match listener.accept() {
            Ok((stream, _)) => {
                let handler = Arc::clone(&handler);
                let stop = Arc::clone(&stop);
                let spawned = std::thread::Builder::new()
                    .name("control-conn".to_string())
                    .spawn(move || {
                        let _ = serve_connection(stream, handler.as_ref(), &stop);
                    });
                if let Ok(handle) = spawned {
                    connections.push(handle);
                }
                connections.retain(|h| !h.is_finished());
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                std::thread::sleep(Duration::from_millis(STOP_POLL_MS / 2));
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(_) => std::thread::sleep(Duration::from_millis(STOP_POLL_MS)),
        }
    }
    // 4.
    for handle in connections {
        let _ = handle.join();
    }
    let _ = std::fs::remove_file(&socket_path);
}

/// Answers the lines of one connection until the client hangs up or `stop` is set.
fn serve_connection(
    stream: UnixStream,
    handler: &dyn ControlHandler,
    stop: &AtomicBool,
) -> io::Result<()> {
    stream.set_nonblocking(false)?;
    stream.set_read_timeout(Some(Duration::from_millis(STOP_POLL_MS)))?;
    let mut writer = stream.try_clone()?;
    let mut reader = BufReader::new(stream);
    let mut line: Vec<u8> = Vec::new();
    loop {
        if stop.load(Ordering::SeqCst) && line.is_empty() {
            return Ok(());
        }
        let available = match reader.fill_buf() {
            Ok(available) => available,
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock
                        | io::ErrorKind::TimedOut
                        | io::ErrorKind::Interrupted
                ) =>
            {
                continue
            }
            Err(e) => return Err(e),
        };
        if available.is_empty() {
            return Ok(()); // The client hung up.
        }
        let (taken, complete) = match available.iter().position(|&b| b == b'\n') {
            Some(end) => (end + 1, true),
            None => (available.len(), false),
        };
        line.extend_from_slice(&available[..taken]);
        reader.consume(taken);
        if line.len() > LINE_BYTES_MAX + 1 {
            // Answer once and drop the connection: the rest of the line cannot be
            // told apart from the next request.
            let response = Response::error(format!(
                "request longer than {LINE_BYTES_MAX} bytes; closing the connection"
            ));
            write_response(&mut writer, &response)?;
            return Ok(());
        }
        if !complete {
            continue;
        }
        let text = String::from_utf8_lossy(&line).into_owned();
        line.clear();
        if text.trim().is_empty() {
            continue;
        }
        let response = match decode_request(&text) {
            Ok(request) => {
                let name = request.name();
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| handler.handle(request)))
                    .unwrap_or_else(|_| {
                        Response::error(format!(
                            "makod failed while handling `{name}` (a bug: see makod.log)"
                        ))
                    })
            }
            Err(error) => Response::error(error.to_string()),
        };
        write_response(&mut writer, &response)?;
    }
}

fn write_response(writer: &mut UnixStream, response: &Response) -> io::Result<()> {
    let mut line = encode_response(response);
    line.push('\n');
    writer.write_all(line.as_bytes())?;
    writer.flush()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::client::{ClientError, ControlClient};
    use std::io::Read;

    struct TestHandler;

    /// Holds `diag waiters` requests until a test opens it: a daemon that does not
    /// answer in time, without a sleep that merely hopes to be longer than the timeout.
    static GATE: std::sync::Mutex<bool> = std::sync::Mutex::new(false);
    static GATE_OPENED: std::sync::Condvar = std::sync::Condvar::new();

    fn open_gate() {
        *GATE.lock().unwrap() = true;
        GATE_OPENED.notify_all();
    }

    impl ControlHandler for TestHandler {
        fn handle(&self, request: Request) -> Response {
            match request {
                Request::Mount { fs, .. } if fs == "boom" => panic!("test panic"),
                Request::Mount { fs, .. } => Response::ok(format!("{fs} mounted")),
                Request::DiagWaiters { .. } => {
                    let open = GATE.lock().unwrap();
                    // Bounded, so that a test that never opens the gate still ends.
                    let _open = GATE_OPENED
                        .wait_timeout_while(open, Duration::from_secs(60), |open| !*open)
                        .unwrap();
                    Response::Waiters(Vec::new())
                }
                other => Response::error(format!("unsupported {}", other.name())),
            }
        }
    }

    fn start(dir: &Path) -> (PathBuf, Arc<AtomicBool>, JoinHandle<()>) {
        let socket = dir.join("makod.sock");
        let stop = Arc::new(AtomicBool::new(false));
        let handle = serve(&socket, Arc::new(TestHandler), Arc::clone(&stop)).unwrap();
        (socket, stop, handle)
    }

    #[test]
    fn client_and_server_over_a_socket() {
        let dir = tempfile::tempdir().unwrap();
        let (socket, stop, handle) = start(dir.path());
        let mode = std::fs::metadata(&socket).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);

        let mut client = ControlClient::connect(&socket).unwrap();
        for _ in 0..3 {
            let answer = client
                .call(&Request::Mount {
                    fs: "fs1".into(),
                    mountpoint: None,
                    options: String::new(),
                })
                .unwrap();
            assert_eq!(answer, Response::ok("fs1 mounted"));
        }
        assert_eq!(
            client.call(&Request::Sync).unwrap(),
            Response::error("unsupported sync")
        );
        // A panicking handler becomes an error; the connection keeps working.
        let answer = client
            .call(&Request::Mount {
                fs: "boom".into(),
                mountpoint: None,
                options: String::new(),
            })
            .unwrap();
        assert!(matches!(answer, Response::Error { ref message } if message.contains("mount")));
        let answer = client
            .call(&Request::Mount {
                fs: "fs2".into(),
                mountpoint: None,
                options: String::new(),
            })
            .unwrap();
        assert_eq!(answer, Response::ok("fs2 mounted"));

        // A second daemon on the same socket is refused.
        let error = serve(
            &socket,
            Arc::new(TestHandler),
            Arc::new(AtomicBool::new(false)),
        )
        .unwrap_err();
        assert_eq!(error.kind(), io::ErrorKind::AddrInUse);

        stop.store(true, Ordering::SeqCst);
        handle.join().unwrap();
        assert!(!socket.exists(), "socket removed at stop");
        drop(client);
    }

    #[test]
    fn timeout_is_reported() {
        let dir = tempfile::tempdir().unwrap();
        let (socket, stop, handle) = start(dir.path());
        let mut client = ControlClient::connect(&socket).unwrap();
        client.set_timeout(Duration::from_millis(50));
        let error = client
            .call(&Request::DiagWaiters { threshold_ms: 400 })
            .unwrap_err();
        assert!(matches!(error, ClientError::Timeout { .. }), "{error}");
        assert!(error.to_string().contains("did not answer `diag_waiters`"));
        open_gate();
        stop.store(true, Ordering::SeqCst);
        handle.join().unwrap();
    }

    #[test]
    fn malformed_input_gets_an_error_response() {
        let dir = tempfile::tempdir().unwrap();
        let (socket, stop, handle) = start(dir.path());
        let mut stream = UnixStream::connect(&socket).unwrap();
        stream
            .write_all(
                b"garbage\n{\"v\":9,\"request\":\"status\"}\n\xff\xfe\n{\"v\":1,\"request\":{\"mount\":{\"fs\":\"x\"}}}\n",
            )
            .unwrap();
        let mut reader = BufReader::new(stream.try_clone().unwrap());
        let mut lines = Vec::new();
        for _ in 0..4 {
            let mut line = String::new();
            reader.read_line(&mut line).unwrap();
            lines.push(crate::protocol::decode_response(&line).unwrap());
        }
        assert!(matches!(&lines[0], Response::Error { message } if message.contains("malformed")));
        assert!(matches!(&lines[1], Response::Error { message } if message.contains("speaks v9")));
        assert!(matches!(&lines[2], Response::Error { message } if message.contains("malformed")));
        assert_eq!(lines[3], Response::ok("x mounted"));

        // A line without end that exceeds the limit is answered and the connection closed.
        let big = vec![b'x'; LINE_BYTES_MAX + 10];
        let _ = stream.write_all(&big);
        let mut line = String::new();
        reader.read_line(&mut line).unwrap();
        assert!(line.contains("longer than"), "{line}");
        let mut rest = Vec::new();
        let _ = reader.read_to_end(&mut rest);
        stop.store(true, Ordering::SeqCst);
        handle.join().unwrap();
    }

    #[test]
    fn no_daemon_and_stale_socket() {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("makod.sock");
        let error = ControlClient::connect(&socket).unwrap_err();
        assert_eq!(
            error.to_string(),
            format!(
                "makod is not running (no socket at {}); start it with `mako up`",
                socket.display()
            )
        );
        // A socket file left by a dead daemon.
        drop(UnixListener::bind(&socket).unwrap());
        assert!(socket.exists());
        assert!(matches!(
            ControlClient::connect(&socket).unwrap_err(),
            ClientError::NotRunning { .. }
        ));
        let stop = Arc::new(AtomicBool::new(false));
        let handle = serve(&socket, Arc::new(TestHandler), Arc::clone(&stop)).unwrap();
        let mut client = ControlClient::connect(&socket).unwrap();
        assert_eq!(
            client
                .call(&Request::Mount {
                    fs: "a".into(),
                    mountpoint: None,
                    options: String::new(),
                })
                .unwrap(),
            Response::ok("a mounted")
        );
        stop.store(true, Ordering::SeqCst);
        handle.join().unwrap();
    }
}
