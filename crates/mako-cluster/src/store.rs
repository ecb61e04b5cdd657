//! The raft log and the applied configuration of one node, in one redb file
//! (`<data_dir>/cluster.redb`).
//!
//! Tables: `raft_log` (log index → entry) and `meta` (`vote`, `committed`,
//! `last_purged`, `applied`, `snapshot`). Every value is in the `codec` encoding, so
//! damage is reported by name instead of being decoded into nonsense.
//!
//! *Invariants*: a write is durable when openraft is told it is (redb commits with
//! `Durability::Immediate`: fsync before `commit` returns); the applied state — the
//! configuration, the last applied log id and the membership — is written in one
//! transaction per batch of entries, so after a crash it matches one log position
//! exactly and openraft re-applies only what follows it; an installed snapshot
//! replaces the applied state and is kept in the same transaction. Config changes are
//! rare and small, so these writes run on raft's own tasks without a separate thread.

use crate::codec::{self, CodecError, Kind};
use crate::model::{ClusterConfig, ConfigError};
use crate::{Member, Outcome, Proposal, RaftNodeId, TypeConfig};
use openraft::storage::{LogFlushed, LogState, RaftLogStorage, RaftStateMachine, Snapshot};
use openraft::{
    Entry, EntryPayload, LogId, OptionalSend, RaftLogReader, RaftSnapshotBuilder, SnapshotMeta,
    StorageError, StorageIOError, StoredMembership, Vote,
};
use parking_lot::RwLock;
use redb::{Database, ReadableTable, TableDefinition};
use serde::{Deserialize, Serialize};
use std::collections::VecDeque;
use std::fmt::Debug;
use std::io::Cursor;
use std::ops::{Bound, RangeBounds};
use std::path::{Path, PathBuf};
use std::sync::Arc;

const LOG: TableDefinition<u64, &[u8]> = TableDefinition::new("raft_log");
const META: TableDefinition<&str, &[u8]> = TableDefinition::new("meta");

/// The file name of a node's cluster store inside its data directory.
pub const FILE_NAME: &str = "cluster.redb";

type StorageResult<T> = Result<T, StorageError<RaftNodeId>>;

/// Why the store could not be opened, read or written.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("cluster store {path}: {source}")]
    Open {
        path: PathBuf,
        #[source]
        source: Box<redb::Error>,
    },
    /// Boxed: redb's error is large, and every store call returns this.
    #[error("cluster store: {0}")]
    Redb(Box<redb::Error>),
    #[error("cluster store: {0}")]
    Codec(#[from] CodecError),
    #[error("cluster store directory {path}: {source}")]
    Directory {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

fn redb_err(e: impl Into<redb::Error>) -> StoreError {
    StoreError::Redb(Box::new(e.into()))
}

/// How many recent proposal outcomes the state machine remembers (a retried proposal
/// older than this would be applied again; retries happen within one deadline, a few
/// proposals apart).
pub const RECENT_PROPOSALS: usize = 1024;

/// The replicated state: the configuration and the outcomes of recent proposals.
/// Snapshots carry exactly this.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Replicated {
    pub config: ClusterConfig,
    /// (proposal id, outcome), oldest first, at most `RECENT_PROPOSALS`.
    pub recent: VecDeque<([u8; 16], Result<u64, ConfigError>)>,
}

impl Replicated {
    /// Applies one proposal, or answers a repeated one with its first outcome.
    pub fn apply(&mut self, proposal: &Proposal) -> Result<u64, ConfigError> {
        if let Some((_, outcome)) = self.recent.iter().find(|(id, _)| *id == proposal.id) {
            return outcome.clone();
        }
        let outcome = self.config.apply(&proposal.command);
        if self.recent.len() == RECENT_PROPOSALS {
            self.recent.pop_front();
        }
        self.recent.push_back((proposal.id, outcome.clone()));
        outcome
    }
}

/// What has been applied: the replicated state and where in the log it stands.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Applied {
    pub last_applied: Option<LogId<RaftNodeId>>,
    pub membership: StoredMembership<RaftNodeId, Member>,
    pub state: Replicated,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
struct StoredSnapshot {
    meta: SnapshotMeta<RaftNodeId, Member>,
    /// The replicated state in the `codec` encoding (kind `Config`).
    data: Vec<u8>,
}

/// Opens (or creates) `<dir>/cluster.redb` and returns the log store and the state
/// machine openraft runs on, plus the applied state they share with the `Quorum`.
pub fn open(dir: &Path) -> Result<(LogStore, StateMachine), StoreError> {
    std::fs::create_dir_all(dir).map_err(|source| StoreError::Directory {
        path: dir.to_path_buf(),
        source,
    })?;
    let path = dir.join(FILE_NAME);
    let db = Database::create(&path).map_err(|e| StoreError::Open {
        path: path.clone(),
        source: Box::new(e.into()),
    })?;
    // Both tables exist from the start, so a read never meets a missing table.
    let tx = db.begin_write().map_err(redb_err)?;
    tx.open_table(LOG).map_err(redb_err)?;
    tx.open_table(META).map_err(redb_err)?;
    tx.commit().map_err(redb_err)?;
    let db = Arc::new(db);
    let applied = match get_meta(&db, "applied")? {
        Some(bytes) => codec::decode(Kind::Applied, "applied state", &bytes)?,
        None => Applied::default(),
    };
    let log = LogStore { db: db.clone() };
    let sm = StateMachine {
        db,
        applied: Arc::new(RwLock::new(applied)),
        snapshot_seq: 0,
    };
    Ok((log, sm))
}

fn get_meta(db: &Database, key: &str) -> Result<Option<Vec<u8>>, StoreError> {
    let tx = db.begin_read().map_err(redb_err)?;
    let table = tx.open_table(META).map_err(redb_err)?;
    let value = table.get(key).map_err(redb_err)?;
    Ok(value.map(|v| v.value().to_vec()))
}

fn put_meta(db: &Database, pairs: &[(&str, &[u8])]) -> Result<(), StoreError> {
    let tx = db.begin_write().map_err(redb_err)?;
    {
        let mut table = tx.open_table(META).map_err(redb_err)?;
        for (key, value) in pairs {
            table.insert(*key, *value).map_err(redb_err)?;
        }
    }
    tx.commit().map_err(redb_err)
}

fn read_err(e: StoreError) -> StorageError<RaftNodeId> {
    StorageIOError::read(&e).into()
}

fn logs_read_err(e: StoreError) -> StorageError<RaftNodeId> {
    StorageIOError::read_logs(&e).into()
}

fn logs_write_err(e: StoreError) -> StorageError<RaftNodeId> {
    StorageIOError::write_logs(&e).into()
}

/// The raft log, vote and committed log id.
#[derive(Clone)]
pub struct LogStore {
    db: Arc<Database>,
}

impl LogStore {
    fn get_log_id(&self, key: &str) -> Result<Option<LogId<RaftNodeId>>, StoreError> {
        match get_meta(&self.db, key)? {
            Some(bytes) => Ok(codec::decode(Kind::LogId, key, &bytes)?),
            None => Ok(None),
        }
    }

    fn last_entry_id(&self) -> Result<Option<LogId<RaftNodeId>>, StoreError> {
        let tx = self.db.begin_read().map_err(redb_err)?;
        let table = tx.open_table(LOG).map_err(redb_err)?;
        let Some((index, bytes)) = table.last().map_err(redb_err)? else {
            return Ok(None);
        };
        let entry: Entry<TypeConfig> = codec::decode(
            Kind::LogEntry,
            &format!("log entry {}", index.value()),
            bytes.value(),
        )?;
        Ok(Some(entry.log_id))
    }

    fn entries(
        &self,
        range: (Bound<u64>, Bound<u64>),
    ) -> Result<Vec<Entry<TypeConfig>>, StoreError> {
        let tx = self.db.begin_read().map_err(redb_err)?;
        let table = tx.open_table(LOG).map_err(redb_err)?;
        let mut out = Vec::new();
        for item in table.range::<u64>(range).map_err(redb_err)? {
            let (index, bytes) = item.map_err(redb_err)?;
            let what = format!("log entry {}", index.value());
            let entry: Entry<TypeConfig> = codec::decode(Kind::LogEntry, &what, bytes.value())?;
            if entry.log_id.index != index.value() {
                return Err(StoreError::Codec(CodecError::Body {
                    what,
                    reason: format!("it holds entry {} (misplaced)", entry.log_id.index),
                }));
            }
            out.push(entry);
        }
        Ok(out)
    }

    /// Removes the entries in `range` and, if given, records `purged` in the same
    /// transaction.
    fn remove(
        &self,
        range: (Bound<u64>, Bound<u64>),
        purged: Option<&[u8]>,
    ) -> Result<(), StoreError> {
        let tx = self.db.begin_write().map_err(redb_err)?;
        {
            let mut table = tx.open_table(LOG).map_err(redb_err)?;
            let keys: Vec<u64> = table
                .range::<u64>(range)
                .map_err(redb_err)?
                .map(|item| item.map(|(k, _)| k.value()))
                .collect::<Result<_, _>>()
                .map_err(redb_err)?;
            for key in keys {
                table.remove(key).map_err(redb_err)?;
            }
            if let Some(purged) = purged {
                let mut meta = tx.open_table(META).map_err(redb_err)?;
                meta.insert("last_purged", purged).map_err(redb_err)?;
            }
        }
        tx.commit().map_err(redb_err)
    }
}

impl RaftLogReader<TypeConfig> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> StorageResult<Vec<Entry<TypeConfig>>> {
        let range = (range.start_bound().cloned(), range.end_bound().cloned());
        self.entries(range).map_err(logs_read_err)
    }
}

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = Self;

    async fn get_log_state(&mut self) -> StorageResult<LogState<TypeConfig>> {
        let last_purged_log_id = self.get_log_id("last_purged").map_err(logs_read_err)?;
        let last = self.last_entry_id().map_err(logs_read_err)?;
        Ok(LogState {
            last_purged_log_id,
            last_log_id: last.or(last_purged_log_id),
        })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote<RaftNodeId>) -> StorageResult<()> {
        let bytes = codec::encode(Kind::Vote, vote)
            .map_err(|e| StorageIOError::write_vote(&StoreError::Codec(e)))?;
        put_meta(&self.db, &[("vote", &bytes)]).map_err(|e| StorageIOError::write_vote(&e).into())
    }

    async fn read_vote(&mut self) -> StorageResult<Option<Vote<RaftNodeId>>> {
        match get_meta(&self.db, "vote").map_err(|e| StorageIOError::read_vote(&e))? {
            Some(bytes) => codec::decode(Kind::Vote, "vote", &bytes)
                .map(Some)
                .map_err(|e| StorageIOError::read_vote(&StoreError::Codec(e)).into()),
            None => Ok(None),
        }
    }

    async fn save_committed(&mut self, committed: Option<LogId<RaftNodeId>>) -> StorageResult<()> {
        let bytes = codec::encode(Kind::LogId, &committed)
            .map_err(|e| StorageIOError::write(&StoreError::Codec(e)))?;
        put_meta(&self.db, &[("committed", &bytes)]).map_err(|e| StorageIOError::write(&e).into())
    }

    async fn read_committed(&mut self) -> StorageResult<Option<LogId<RaftNodeId>>> {
        self.get_log_id("committed").map_err(read_err)
    }

    async fn append<I>(&mut self, entries: I, callback: LogFlushed<TypeConfig>) -> StorageResult<()>
    where
        I: IntoIterator<Item = Entry<TypeConfig>> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let result = (|| -> Result<(), StoreError> {
            let tx = self.db.begin_write().map_err(redb_err)?;
            {
                let mut table = tx.open_table(LOG).map_err(redb_err)?;
                for entry in entries {
                    let bytes = codec::encode(Kind::LogEntry, &entry)?;
                    table
                        .insert(entry.log_id.index, bytes.as_slice())
                        .map_err(redb_err)?;
                }
            }
            tx.commit().map_err(redb_err)
        })();
        match result {
            Ok(()) => {
                callback.log_io_completed(Ok(()));
                Ok(())
            }
            Err(e) => {
                let message = e.to_string();
                callback.log_io_completed(Err(std::io::Error::other(message)));
                Err(logs_write_err(e))
            }
        }
    }

    async fn truncate(&mut self, log_id: LogId<RaftNodeId>) -> StorageResult<()> {
        self.remove((Bound::Included(log_id.index), Bound::Unbounded), None)
            .map_err(logs_write_err)
    }

    async fn purge(&mut self, log_id: LogId<RaftNodeId>) -> StorageResult<()> {
        let purged = codec::encode(Kind::LogId, &Some(log_id))
            .map_err(|e| logs_write_err(StoreError::Codec(e)))?;
        self.remove(
            (Bound::Unbounded, Bound::Included(log_id.index)),
            Some(&purged),
        )
        .map_err(logs_write_err)
    }
}

/// The applied configuration, shared with the node's `Quorum` for local reads.
#[derive(Clone)]
pub struct StateMachine {
    db: Arc<Database>,
    applied: Arc<RwLock<Applied>>,
    snapshot_seq: u64,
}

impl StateMachine {
    /// The applied state, read by the `Quorum` without going through raft.
    pub fn shared(&self) -> Arc<RwLock<Applied>> {
        self.applied.clone()
    }

    fn persist(
        &self,
        applied: &Applied,
        snapshot: Option<&StoredSnapshot>,
    ) -> Result<(), StoreError> {
        let bytes = codec::encode(Kind::Applied, applied)?;
        match snapshot {
            Some(s) => {
                let snap = codec::encode(Kind::Snapshot, s)?;
                put_meta(&self.db, &[("applied", &bytes), ("snapshot", &snap)])
            }
            None => put_meta(&self.db, &[("applied", &bytes)]),
        }
    }

    fn current_snapshot(&self) -> Result<Option<StoredSnapshot>, StoreError> {
        match get_meta(&self.db, "snapshot")? {
            Some(bytes) => Ok(Some(codec::decode(Kind::Snapshot, "snapshot", &bytes)?)),
            None => Ok(None),
        }
    }
}

impl RaftSnapshotBuilder<TypeConfig> for StateMachine {
    async fn build_snapshot(&mut self) -> StorageResult<Snapshot<TypeConfig>> {
        let applied = self.applied.read().clone();
        let data = codec::encode(Kind::Config, &applied.state)
            .map_err(|e| StorageIOError::write_snapshot(None, &StoreError::Codec(e)))?;
        let snapshot_id = match applied.last_applied {
            Some(last) => format!("{}-{}-{}", last.leader_id, last.index, self.snapshot_seq),
            None => format!("empty-{}", self.snapshot_seq),
        };
        let meta = SnapshotMeta {
            last_log_id: applied.last_applied,
            last_membership: applied.membership.clone(),
            snapshot_id,
        };
        let stored = StoredSnapshot {
            meta: meta.clone(),
            data: data.clone(),
        };
        let bytes = codec::encode(Kind::Snapshot, &stored).map_err(|e| {
            StorageIOError::write_snapshot(Some(meta.signature()), &StoreError::Codec(e))
        })?;
        put_meta(&self.db, &[("snapshot", &bytes)])
            .map_err(|e| StorageIOError::write_snapshot(Some(meta.signature()), &e))?;
        Ok(Snapshot {
            meta,
            snapshot: Box::new(Cursor::new(data)),
        })
    }
}

impl RaftStateMachine<TypeConfig> for StateMachine {
    type SnapshotBuilder = Self;

    async fn applied_state(
        &mut self,
    ) -> StorageResult<(
        Option<LogId<RaftNodeId>>,
        StoredMembership<RaftNodeId, Member>,
    )> {
        let applied = self.applied.read();
        Ok((applied.last_applied, applied.membership.clone()))
    }

    async fn apply<I>(&mut self, entries: I) -> StorageResult<Vec<Outcome>>
    where
        I: IntoIterator<Item = Entry<TypeConfig>> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let mut next = self.applied.read().clone();
        let mut outcomes = Vec::new();
        for entry in entries {
            next.last_applied = Some(entry.log_id);
            let outcome = match entry.payload {
                EntryPayload::Blank => Ok(next.state.config.epoch),
                EntryPayload::Normal(proposal) => {
                    let result = next.state.apply(&proposal);
                    if let Err(e) = &result {
                        tracing::info!(
                            index = entry.log_id.index,
                            "configuration change refused: {e}"
                        );
                    }
                    result
                }
                EntryPayload::Membership(membership) => {
                    next.membership = StoredMembership::new(Some(entry.log_id), membership);
                    Ok(next.state.config.epoch)
                }
            };
            outcomes.push(Outcome(outcome));
        }
        // Durable first, then visible: a local read never shows what a crash would undo.
        self.persist(&next, None)
            .map_err(|e| StorageIOError::write_state_machine(&e))?;
        *self.applied.write() = next;
        Ok(outcomes)
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        self.snapshot_seq += 1;
        self.clone()
    }

    async fn begin_receiving_snapshot(&mut self) -> StorageResult<Box<Cursor<Vec<u8>>>> {
        Ok(Box::new(Cursor::new(Vec::new())))
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta<RaftNodeId, Member>,
        snapshot: Box<Cursor<Vec<u8>>>,
    ) -> StorageResult<()> {
        let data = snapshot.into_inner();
        let state: Replicated =
            codec::decode(Kind::Config, "received snapshot", &data).map_err(|e| {
                StorageIOError::read_snapshot(Some(meta.signature()), &StoreError::Codec(e))
            })?;
        let next = Applied {
            last_applied: meta.last_log_id,
            membership: meta.last_membership.clone(),
            state,
        };
        let stored = StoredSnapshot {
            meta: meta.clone(),
            data,
        };
        self.persist(&next, Some(&stored))
            .map_err(|e| StorageIOError::write_snapshot(Some(meta.signature()), &e))?;
        *self.applied.write() = next;
        Ok(())
    }

    async fn get_current_snapshot(&mut self) -> StorageResult<Option<Snapshot<TypeConfig>>> {
        let stored = self
            .current_snapshot()
            .map_err(|e| StorageIOError::read_snapshot(None, &e))?;
        Ok(stored.map(|s| Snapshot {
            meta: s.meta,
            snapshot: Box::new(Cursor::new(s.data)),
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Command;

    #[test]
    fn a_repeated_proposal_is_answered_not_applied_again() {
        let mut state = Replicated::default();
        let create = Proposal {
            id: [1; 16],
            command: Command::CreateCluster {
                name: "c1".into(),
                uuid: [0; 16],
            },
        };
        assert_eq!(state.apply(&create), Ok(1));
        // The same proposal again (a retry after a lost reply): the first outcome, and
        // nothing changes — applied again it would be refused as "already created".
        assert_eq!(state.apply(&create), Ok(1));
        assert_eq!(state.config.epoch, 1);
        // A new proposal with the same command is a new change.
        let again = Proposal {
            id: [2; 16],
            ..create.clone()
        };
        assert!(matches!(
            state.apply(&again),
            Err(ConfigError::AlreadyCreated { .. })
        ));
        // The memory is bounded: the oldest ids are forgotten first.
        for i in 0..RECENT_PROPOSALS as u32 {
            let mut id = [0; 16];
            id[..4].copy_from_slice(&(i + 10).to_le_bytes());
            let _ = state.apply(&Proposal {
                id,
                command: Command::DeleteFs { name: "x".into() },
            });
        }
        assert_eq!(state.recent.len(), RECENT_PROPOSALS);
        assert!(state.recent.iter().all(|(id, _)| *id != [1; 16]));
    }

    #[test]
    fn the_applied_state_survives_reopening_and_damage_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let (_, sm) = open(dir.path()).unwrap();
        let mut applied = Applied::default();
        applied
            .state
            .apply(&Proposal {
                id: [1; 16],
                command: Command::CreateCluster {
                    name: "c1".into(),
                    uuid: [0; 16],
                },
            })
            .unwrap();
        sm.persist(&applied, None).unwrap();
        drop(sm);
        let (_, sm) = open(dir.path()).unwrap();
        assert_eq!(*sm.shared().read(), applied);
        // A damaged value is refused with its name, never decoded.
        let mut bytes = codec::encode(Kind::Applied, &applied).unwrap();
        let last = bytes.len() - 1;
        bytes[last] ^= 1;
        put_meta(&sm.db, &[("applied", &bytes)]).unwrap();
        drop(sm);
        let e = open(dir.path()).err().expect("damage detected").to_string();
        assert!(e.contains("applied state: checksum mismatch"), "{e}");
    }
}
