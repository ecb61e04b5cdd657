//! Sending frames: one writer task per connection drains a queue of frames onto the
//! socket, gathering small frames into one write and sending a large body straight
//! from its own buffer.

use crate::wire::{encode_body, FrameError, Header, Kind, HEADER_BYTES};
use bytes::Bytes;
use serde::Serialize;
use tokio::io::{AsyncWrite, AsyncWriteExt};
use tokio::sync::mpsc::UnboundedReceiver;

/// A frame waiting to be written.
pub(crate) struct OutFrame {
    pub header: [u8; HEADER_BYTES],
    pub body: Bytes,
}

impl OutFrame {
    pub fn new(header: &Header, body: Bytes) -> OutFrame {
        OutFrame {
            header: header.encode(),
            body,
        }
    }
}

/// Frames gathered into one write up to about this many bytes.
const BATCH_BYTES: usize = 64 << 10;
/// Bodies up to this size are copied into the batch; larger ones are written from
/// their own buffer (a block is never copied on its way out).
const COPY_BODY_MAX: usize = 16 << 10;

/// Writes every frame of `queue` to `w` until the queue closes or a write fails.
pub(crate) async fn write_frames<W: AsyncWrite + Unpin>(
    mut w: W,
    mut queue: UnboundedReceiver<OutFrame>,
) -> std::io::Result<()> {
    let mut batch = Vec::with_capacity(BATCH_BYTES + COPY_BODY_MAX + HEADER_BYTES);
    while let Some(first) = queue.recv().await {
        let mut next = Some(first);
        while let Some(frame) = next.take() {
            batch.extend_from_slice(&frame.header);
            if frame.body.len() <= COPY_BODY_MAX {
                batch.extend_from_slice(&frame.body);
            } else {
                w.write_all(&batch).await?;
                batch.clear();
                w.write_all(&frame.body).await?;
            }
            if batch.len() < BATCH_BYTES {
                next = queue.try_recv().ok();
            }
        }
        if !batch.is_empty() {
            w.write_all(&batch).await?;
            batch.clear();
        }
    }
    Ok(())
}

/// Writes one control frame directly (during the handshake, before a writer task).
pub(crate) async fn send_control<W: AsyncWrite + Unpin, T: Serialize>(
    w: &mut W,
    version: u16,
    kind: Kind,
    body: &T,
) -> Result<(), FrameError> {
    let body = encode_body(body);
    let header = Header::new(version, kind, body.len());
    let mut bytes = Vec::with_capacity(HEADER_BYTES + body.len());
    bytes.extend_from_slice(&header.encode());
    bytes.extend_from_slice(&body);
    w.write_all(&bytes).await?;
    Ok(())
}
