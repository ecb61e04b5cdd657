//! Operations under tokens (docs/coherence.md section 3). Every `FileSystem` call runs
//! in `run`: a per-thread frame collects the token holds the operation takes; when a
//! needed token is not held, the operation returns `FsError::NeedToken` *before it
//! changes anything*, `run` drops its holds, acquires the token with nothing held
//! (rule R1) and starts the operation again. After the operation, `run` sends what it
//! owes other nodes (phase C, with the holds still kept) and then drops the holds.
//!
//! Frames nest (an operation calling another), and the outermost one retries. The
//! check that nothing was changed before a `NeedToken` is the journal's own: the error
//! counts as damage, so an operation that changed memory and then found a token
//! missing turns the mount read-only instead of committing half of itself.

use crate::coherence::{Missing, Need};
use crate::core::Core;
use crate::error::{FsError, FsResult};
use mako_token::{ByteRange, Hold, ResourceId, TokenMode};
use std::cell::RefCell;

/// Restarts of one operation before it gives up (each restart acquired a token that a
/// revoke then took away before the operation could hold it: heavy contention).
pub const OP_RESTARTS_MAX: u32 = 200;

/// Work an operation leaves for after its locks and log handle are released: phase C.
pub type Deferred = Box<dyn FnOnce() -> FsResult<()>>;

struct Frame {
    core: usize,
    holds: Vec<Hold>,
    deferred: Vec<Deferred>,
}

thread_local! {
    static FRAMES: RefCell<Vec<Frame>> = const { RefCell::new(Vec::new()) };
}

fn core_id(core: &Core) -> usize {
    core as *const Core as usize
}

/// Run `f` as one operation on `core` (see the module doc).
pub fn run<T>(core: &Core, mut f: impl FnMut() -> FsResult<T>) -> FsResult<T> {
    let id = core_id(core);
    let nested = FRAMES.with(|fr| fr.borrow().iter().any(|x| x.core == id));
    if nested {
        return f();
    }
    let mut last = String::new();
    for _ in 0..OP_RESTARTS_MAX {
        core.check_fence()?;
        FRAMES.with(|fr| {
            fr.borrow_mut().push(Frame {
                core: id,
                holds: Vec::new(),
                deferred: Vec::new(),
            })
        });
        let result = f();
        let frame = FRAMES.with(|fr| {
            let mut fr = fr.borrow_mut();
            let pos = fr.iter().rposition(|x| x.core == id).expect("op frame");
            fr.remove(pos)
        });
        match result {
            Err(FsError::NeedToken(missing)) => {
                drop(frame.holds);
                last = format!("{missing:?}");
                core.stats
                    .op_restarts
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let calls = core.tokens.client().stats().manager_calls;
                core.tokens.acquire(missing)?;
                let granted_anew = core.tokens.client().stats().manager_calls != calls;
                // (An inode-file chunk read before an inode was granted is dropped when
                // that inode is read from it: `Core::read_inode`, by the grant clock.)
                let kind = missing.resource.kind;
                if kind == mako_token::ResourceKind::DirBucket && granted_anew {
                    // Names newly granted: pages cached before, outside any token this
                    // node held, may be stale. Read the directory's blocks again.
                    if let Some(h) = core.cached_handle(missing.resource.id) {
                        crate::directory::refresh_cached(core, &h)?;
                    }
                } else if kind == mako_token::ResourceKind::Inode
                    && granted_anew
                    && core.tokens.inode_mode(missing.resource.id) == Some(TokenMode::Xw)
                {
                    // A directory's inode newly granted in `xw` (after `rw`): an
                    // operation under it reads entries without name tokens (a split
                    // moves whole blocks), and pages cached under `rw` may miss names
                    // other writers inserted under theirs (three nodes creating in one
                    // directory lost names). Read the directory's blocks again.
                    // (A file has no cached directory blocks: nothing to do.)
                    if let Some(h) = core.cached_handle(missing.resource.id) {
                        crate::directory::refresh_cached(core, &h)?;
                    }
                }
            }
            // This node's space ran out (the operation changed nothing: ENOSPC is refused
            // up front): take one more region (nobody's, or else another node's with
            // space) and run it again.
            Err(FsError::NoSpace(why)) => {
                drop(frame.holds);
                if !crate::ownership::acquire_or_steal_region(core)? {
                    return Err(FsError::NoSpace(why));
                }
                last = format!("space ({why})");
            }
            Err(FsError::NeedBlocks { ino, unit }) => {
                drop(frame.holds);
                last = format!("block addresses of inode {ino} unit {unit}");
                core.stats
                    .op_restarts
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                if let Some(h) = core.cached_handle(ino) {
                    // The holds are gone: what is kept is what a steady token covers.
                    let fetched = crate::metanode::fetch_blocks(core, &h, unit, unit + 1, false);
                    // With no hold, this node's write token may have been revoked
                    // meanwhile (then there is nobody to ask, or this node is no longer
                    // a writer): the next attempt asks for the token again (three-node
                    // seed 88).
                    let writer = matches!(
                        core.tokens.inode_mode(ino),
                        Some(TokenMode::Rw) | Some(TokenMode::Xw)
                    );
                    match fetched {
                        Err(FsError::NeedToken(_)) => {}
                        Err(e) if writer => return Err(e),
                        _ => {}
                    }
                }
            }
            other => {
                // Phase C: what the operation owes other nodes, holds still kept.
                let mut result = other;
                for d in frame.deferred {
                    if let Err(e) = d() {
                        if result.is_ok() {
                            result = Err(e);
                        }
                    }
                }
                // Still under its holds: a node fenced meanwhile (a pause past its
                // lease) may have lost the tokens behind what it read or changed.
                if result.is_ok()
                    && !core
                        .test_no_answer_fence
                        .load(std::sync::atomic::Ordering::Relaxed)
                {
                    core.check_fence()?;
                    if let Some(hook) = core.answer_hook.get() {
                        hook();
                    }
                }
                drop(frame.holds);
                return result;
            }
        }
    }
    Err(FsError::Token(format!(
        "operation restarted {OP_RESTARTS_MAX} times: the tokens it needs keep being revoked by other nodes (last missing: {last})"
    )))
}

/// Is this thread inside an operation on `core` (`run`)?
pub(crate) fn in_operation(core: &Core) -> bool {
    let id = core_id(core);
    FRAMES.with(|fr| fr.borrow().iter().any(|x| x.core == id))
}

pub(crate) fn push_hold(core: &Core, hold: Hold) {
    let id = core_id(core);
    FRAMES.with(|fr| {
        let mut fr = fr.borrow_mut();
        match fr.iter_mut().rev().find(|x| x.core == id) {
            Some(frame) => frame.holds.push(hold),
            // Not inside `run` (a background worker, a revoke): the caller keeps the
            // hold itself; dropping it here is a bug caught in debug builds.
            None => {
                debug_assert!(false, "token hold taken outside an operation");
                drop(hold);
            }
        }
    })
}

/// Does the current operation already hold something on `resource`?
fn frame_has_any(core: &Core, resource: ResourceId) -> bool {
    let id = core_id(core);
    FRAMES.with(|fr| {
        fr.borrow()
            .iter()
            .filter(|x| x.core == id)
            .any(|x| x.holds.iter().any(|h| h.resource() == resource))
    })
}

/// Does the current operation hold `resource` over all of `range` in a mode covering
/// `mode` (`None`: any token)?
pub fn holds(core: &Core, resource: ResourceId, range: ByteRange, mode: Option<TokenMode>) -> bool {
    let id = core_id(core);
    FRAMES.with(|fr| {
        fr.borrow().iter().filter(|x| x.core == id).any(|x| {
            x.holds.iter().any(|h| {
                h.resource() == resource
                    && h.range().contains(&range)
                    && match (h.mode(), mode) {
                        (_, None) => true,
                        (Some(held), Some(m)) => mako_token::covers(held, m),
                        (None, Some(_)) => false,
                    }
            })
        })
    })
}

/// Does the current operation hold inode `ino` for `need`?
pub fn holds_inode(core: &Core, ino: u64, need: Need) -> bool {
    let mode = match need {
        Need::Cache => None,
        Need::Write => Some(TokenMode::Rw),
        Need::Exclusive => Some(TokenMode::Xw),
    };
    holds(core, core.tokens.inode(ino), ByteRange::WHOLE, mode)
}

/// True if the current thread runs an operation on `core`.
pub fn in_op(core: &Core) -> bool {
    let id = core_id(core);
    FRAMES.with(|fr| fr.borrow().iter().any(|x| x.core == id))
}

/// Hold the inode token the operation needs, or ask for it (`NeedToken`).
pub fn hold_inode(core: &Core, ino: u64, need: Need) -> FsResult<()> {
    if need == Need::Cache && frame_has_any(core, core.tokens.inode(ino)) {
        return Ok(());
    }
    match core.tokens.try_hold_inode(ino, need) {
        Ok(h) => {
            push_hold(core, h);
            Ok(())
        }
        Err(missing) => Err(FsError::need_token(missing)),
    }
}

/// Hold `mode` over `range` of a ranged resource (data, directory names).
pub fn hold_range(
    core: &Core,
    resource: ResourceId,
    mode: TokenMode,
    range: ByteRange,
    desired: ByteRange,
) -> FsResult<()> {
    match core.tokens.try_hold_range(resource, mode, range, desired) {
        Ok(h) => {
            push_hold(core, h);
            Ok(())
        }
        Err(missing) => Err(FsError::need_token(missing)),
    }
}

/// Leave `work` for phase C of the current operation (after its locks and log handle
/// are released, before its holds are). Outside an operation it runs at once.
pub fn defer(core: &Core, work: Deferred) -> FsResult<()> {
    let id = core_id(core);
    let work = FRAMES.with(|fr| {
        let mut fr = fr.borrow_mut();
        match fr.iter_mut().rev().find(|x| x.core == id) {
            Some(frame) => {
                frame.deferred.push(work);
                None
            }
            None => Some(work),
        }
    });
    match work {
        Some(w) => w(),
        None => Ok(()),
    }
}

/// The token an operation needs before it may change inode `ino` (`Need::Write` for
/// data, size and times; `Need::Exclusive` for anything else).
pub fn missing_inode(core: &Core, ino: u64, need: Need) -> Missing {
    core.tokens.inode_missing(ino, need)
}
