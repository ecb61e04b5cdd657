//! Token-manager shards over the manager nodes, and their takeover when a manager node
//! fails (issue 14; docs/coherence.md section 7b, docs/cluster.md "Sharding the token
//! manager over manager nodes").
//!
//! - **Routing.** The token manager is sharded over the manager nodes of cluster.toml
//!   (slot `i` is the `i`-th manager node, `ManagerMap::slot_for`). A manager node
//!   whose table was lost — the replicated configuration lists it expelled, or at a
//!   lease epoch past the first (it was expelled and rejoined since the cluster was
//!   made) — serves no slot: its slot goes to the *successor*, the lowest-numbered
//!   manager node that never lost its table ([`token_routing`]). Every node derives the
//!   same routing from the same configuration, so the move needs no message of its
//!   own. A manager node that rejoins stays a plain node (its slot is not handed back:
//!   the successor's table is the slot's only one); with no successor left, the slot
//!   stays where it was, and the mounts that hold its tokens are fenced ([`ShardWatch`]).
//! - **Takeover.** On each manager node, the `token-takeover` thread follows the
//!   configuration ([`run_takeover`]). When a slot becomes its own, it starts the
//!   slot's rebuild (`TokenManager::begin_rebuild`: nothing of the slot is granted until
//!   every live node reported what it holds there and the failed node was recovered —
//!   its log replayed, then its tokens released, `mako_fs::recovery::recover_failed_node`,
//!   run by the cluster manager's expel as before), asks every live node
//!   (`ClientRequest::HeldIn`; a node that mounts nothing answers `NoService`, holds
//!   nothing), and logs the rebuild's end. Before it began, the slot's requests are
//!   refused (`TokenManager::serve_slots`), so a client that saw the move first asks
//!   again.
//! - **Clients.** A request to a manager node that does not answer waits for its slot
//!   to move (`TokenClient::set_manager_failover_wait`, the holder-down wait), then
//!   goes to the successor; `Rebuilding` refusals are waited out the same way. The
//!   routing reaches a mount through the successor's `HeldIn` or its [`ShardWatch`],
//!   whichever comes first.
//!
//! Not supported (the mounts are fenced with the reason, as before): a slot whose
//! node fails with no manager node left that never lost its table; several slots moving
//! to one node at once (a successor that had taken a slot over fails too: one rebuild
//! at a time per manager); a manager node restarted without being expelled (its table
//! is new and nothing rebuilds it).

use mako_cluster::{ClusterConfig, Quorum, FIRST_LEASE_EPOCH};
use mako_rt::{CallOptions, NodeId, ServiceId, Transport, TransportError};
use mako_token::{ClientReply, ClientRequest, ManagerMap, TokenClient, TokenManager};
use parking_lot::Mutex;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

/// How often the routing is derived again from the configuration (a copy of it).
const CHECK_INTERVAL: Duration = Duration::from_millis(100);
/// How long one `HeldIn` may take (a node answers once its acquires in flight to the
/// slot have come back).
const REPORT_DEADLINE: Duration = Duration::from_secs(30);
/// Pause before asking again the nodes that did not answer.
const REPORT_RETRY: Duration = Duration::from_millis(200);

/// Did manager node `node` lose its token table (expelled now, or rejoined since)?
fn lost(config: &ClusterConfig, node: NodeId) -> bool {
    let lease = config.lease_of(node);
    lease.expelled.is_some() || lease.epoch != FIRST_LEASE_EPOCH
}

/// The routing of the token-manager slots: slot `i` is `managers[i]` unless that node
/// lost its table and a successor (the lowest-numbered manager node that never lost
/// its table) exists.
pub fn token_routing(config: &ClusterConfig, managers: &[NodeId]) -> ManagerMap {
    let successor = managers.iter().copied().filter(|m| !lost(config, *m)).min();
    ManagerMap {
        nodes: managers
            .iter()
            .map(|m| match successor {
                Some(s) if lost(config, *m) => s,
                _ => *m,
            })
            .collect(),
    }
}

/// A mount's watch of the token-manager routing: it follows the slots' moves (the
/// client routes by them from then on) and fences the mount for good (EIO, with the
/// reason in makod.log, until it is mounted again) when a slot whose tokens it may
/// hold cannot be rebuilt.
pub struct ShardWatch {
    quorum: Arc<Quorum>,
    me: NodeId,
    managers: Vec<NodeId>,
    state: Mutex<WatchState>,
    client: OnceLock<TokenClient>,
    lost: OnceLock<String>,
    checked: Mutex<Option<Instant>>,
}

struct WatchState {
    /// The configuration epoch of the newest configuration seen.
    epoch: u64,
    map: ManagerMap,
    /// Each serving node but this one: the lease epoch its table was seen at, and
    /// whether it was expelled then (restarted before its rejoin: its table is the new
    /// one, and its rejoin is the expected next epoch).
    serving: BTreeMap<NodeId, (u64, bool)>,
}

fn serving_of(
    config: &ClusterConfig,
    map: &ManagerMap,
    me: NodeId,
) -> BTreeMap<NodeId, (u64, bool)> {
    map.nodes
        .iter()
        .filter(|m| **m != me)
        .map(|m| {
            let lease = config.lease_of(*m);
            (*m, (lease.epoch, lease.expelled.is_some()))
        })
        .collect()
}

impl ShardWatch {
    /// Watches the routing of `managers` (cluster.toml's) from now on, starting from
    /// the one the mount is made with (`routing`).
    pub fn new(quorum: Arc<Quorum>, me: NodeId, managers: &[NodeId]) -> ShardWatch {
        let config = quorum.read_local();
        let map = token_routing(&config, managers);
        let serving = serving_of(&config, &map, me);
        ShardWatch {
            quorum,
            me,
            managers: managers.to_vec(),
            state: Mutex::new(WatchState {
                epoch: config.epoch,
                map,
                serving,
            }),
            client: OnceLock::new(),
            lost: OnceLock::new(),
            checked: Mutex::new(None),
        }
    }

    /// The routing the mount starts with.
    pub fn routing(&self) -> ManagerMap {
        self.state.lock().map.clone()
    }

    /// The mount's token client, told of each move.
    pub fn set_client(&self, client: TokenClient) {
        let _ = self.client.set(client);
    }

    fn fence(&self, reason: String) -> Result<(), String> {
        if self.lost.set(reason.clone()).is_ok() {
            tracing::error!("{reason}");
        }
        Err(reason)
    }

    /// Err (the reason) once a slot this mount may hold tokens of was lost for good.
    pub fn check(&self) -> Result<(), String> {
        if let Some(reason) = self.lost.get() {
            return Err(reason.clone());
        }
        if self.managers.len() <= 1 && self.managers.first() == Some(&self.me) {
            return Ok(());
        }
        {
            let mut checked = self.checked.lock();
            if checked.is_some_and(|t| t.elapsed() < CHECK_INTERVAL) {
                return Ok(());
            }
            *checked = Some(Instant::now());
        }
        let config = self.quorum.read_local();
        let mut state = self.state.lock();
        // Never by an older configuration than one seen.
        if config.epoch < state.epoch {
            return Ok(());
        }
        state.epoch = config.epoch;
        let new = token_routing(&config, &self.managers);
        if new != state.map {
            // Moves: each slot to a node that never lost its table, one slot per node
            // at a time (a manager rebuilds one slot at a time).
            let mut taken: BTreeMap<NodeId, Vec<usize>> = BTreeMap::new();
            for (i, (old, now)) in state.map.nodes.iter().zip(&new.nodes).enumerate() {
                if old != now {
                    taken.entry(*now).or_default().push(i);
                }
            }
            if let Some((to, slots)) = taken
                .iter()
                .find(|(to, s)| s.len() > 1 || lost(&config, **to))
            {
                let from: Vec<String> = slots
                    .iter()
                    .map(|i| state.map.nodes[*i].to_string())
                    .collect();
                return self.fence(format!(
                    "the token manager slots {slots:?} (of {}) moved to {to} at once; rebuilding \
                     more than one slot on a node at a time is not supported, so the tokens \
                     this mount holds from them are backed by nothing: this mount returns EIO \
                     until it is mounted again",
                    from.join(", ")
                ));
            }
            for (to, slots) in &taken {
                tracing::warn!(
                    "token manager slot {} of {} taken over by {to}: this mount routes it \
                     there from now on (the slot is rebuilt from the survivors' tokens)",
                    slots[0],
                    state.map.nodes[slots[0]]
                );
            }
            state.serving = serving_of(&config, &new, self.me);
            state.map = new.clone();
            if let Some(c) = self.client.get() {
                c.set_managers(new);
            }
        }
        for (m, (epoch, pending)) in state.serving.iter_mut() {
            let lease = config.lease_of(*m);
            let how = match (&lease.expelled, lease.epoch) {
                // Restarted before its rejoin, as at the mount.
                (Some(_), now) if *pending && now == *epoch => continue,
                // Its rejoin, the next epoch.
                (None, now) if *pending && now == *epoch + 1 => {
                    *pending = false;
                    *epoch = now;
                    continue;
                }
                (None, now) if !*pending && now == *epoch => continue,
                (Some(e), _) => format!("was expelled by {} ({})", e.by, e.reason),
                (None, now) => {
                    format!("was expelled and rejoined (lease epoch {epoch}, now {now})")
                }
            };
            let m = *m;
            return self.fence(format!(
                "the token manager shard of {m} was lost: {m} {how}, and no manager node that \
                 never lost its table is left to take its slot over, so the tokens this \
                 mount holds from it are backed by nothing: this mount returns EIO until it \
                 is mounted again with every manager node running (mako down; mako up)"
            ));
        }
        Ok(())
    }
}

/// The `token-takeover` thread of a manager node: serves the slots the configuration
/// gives this node, and rebuilds each slot it takes over (module documentation).
pub fn run_takeover(
    manager: Arc<TokenManager>,
    quorum: Arc<Quorum>,
    transport: Arc<dyn Transport>,
    me: NodeId,
    managers: Vec<NodeId>,
    stop: Arc<AtomicBool>,
) {
    let mut last: Option<ManagerMap> = None;
    let mut seen = 0u64;
    while !stop.load(Ordering::SeqCst) {
        // The first routing from the configuration as committed (a restarted node's
        // own copy may be the one it stopped with), then from this node's copy.
        let config = match &last {
            None => match quorum.read_config() {
                Ok(c) => c,
                Err(_) => {
                    std::thread::sleep(CHECK_INTERVAL);
                    continue;
                }
            },
            Some(_) => quorum.read_local(),
        };
        // Before the configuration is known (the quorum not joined yet) nothing moves;
        // nor by an older configuration than one seen (a restarted node's copy catches
        // up from the one it stopped with).
        if config.nodes.is_empty() || config.epoch < seen {
            std::thread::sleep(CHECK_INTERVAL);
            continue;
        }
        seen = config.epoch;
        let map = token_routing(&config, &managers);
        match &last {
            None => {
                tracing::info!(
                    "token manager of {me}: serves slots {:?} of routing {:?}",
                    slots_of(&map, me),
                    map.nodes
                );
                manager.serve_slots(map.clone(), me);
            }
            Some(old) if *old != map => {
                let new: Vec<usize> = slots_of(&map, me)
                    .into_iter()
                    .filter(|i| old.nodes.get(*i) != Some(&me))
                    .collect();
                // Slots that moved away are no longer served here; a slot taken over is
                // served once its rebuild began (`begin_rebuild`), never before.
                let mut served = map.clone();
                for i in &new {
                    served.nodes[*i] = old.nodes[*i];
                }
                manager.serve_slots(served, me);
                match new.as_slice() {
                    [] => {}
                    [slot] => {
                        let failed = old.nodes[*slot];
                        rebuild(
                            &manager,
                            &config,
                            &*transport,
                            &map,
                            *slot,
                            failed,
                            me,
                            &stop,
                        );
                    }
                    slots => tracing::error!(
                        "token manager of {me}: slots {slots:?} moved here at once; rebuilding \
                         more than one slot at a time is not supported: they stay refused, and \
                         the mounts holding their tokens are fenced"
                    ),
                }
            }
            Some(_) => {}
        }
        last = Some(map);
        std::thread::sleep(CHECK_INTERVAL);
    }
}

fn slots_of(map: &ManagerMap, me: NodeId) -> Vec<usize> {
    (0..map.nodes.len())
        .filter(|i| map.nodes[*i] == me)
        .collect()
}

/// Rebuilds slot `slot` of `map`, lost with `failed`: begins the rebuild, collects every
/// live node's report, and logs when the rebuild is over (the failed node's recovery
/// may end it later than the reports).
#[allow(clippy::too_many_arguments)]
fn rebuild(
    manager: &TokenManager,
    config: &ClusterConfig,
    transport: &dyn Transport,
    map: &ManagerMap,
    slot: usize,
    failed: NodeId,
    me: NodeId,
    stop: &AtomicBool,
) {
    let started = Instant::now();
    let live: Vec<NodeId> = config
        .nodes
        .keys()
        .copied()
        .filter(|n| config.lease_of(*n).expelled.is_none())
        .collect();
    tracing::warn!(
        "token manager of {me}: takes slot {slot} over from {failed}, whose table was lost; \
         rebuilding it from the reports of {} live nodes and the recovery of {failed}",
        live.len()
    );
    manager.begin_rebuild(map.clone(), slot, &live, &[failed]);
    let request = ClientRequest::HeldIn {
        slot: u32::try_from(slot).unwrap_or(u32::MAX),
        managers: map.clone(),
    };
    let Ok(body) = mako_rt::encode("held in", &request) else {
        tracing::error!("token manager of {me}: cannot encode the report request");
        return;
    };
    let mut tokens = 0usize;
    let mut reports = 0usize;
    let mut rounds = 0u32;
    while !stop.load(Ordering::SeqCst) {
        let (reporting, _) = manager.rebuild_waits_for();
        if reporting.is_empty() {
            break;
        }
        rounds += 1;
        let calls = reporting
            .iter()
            .map(|n| (*n, ServiceId::TokenClient, body.clone()))
            .collect();
        let answers = transport.call_many(
            calls,
            CallOptions {
                deadline: REPORT_DEADLINE,
                ..CallOptions::default()
            },
        );
        let mut missing = Vec::new();
        for (node, answer) in reporting.iter().zip(answers) {
            match answer {
                Ok(b) => match mako_rt::decode::<ClientReply>("held reply", &b) {
                    Ok(ClientReply::Held(held)) => {
                        if manager.apply_report(*node, &held) {
                            tokens += held.len();
                            reports += 1;
                        }
                    }
                    other => missing.push(format!("{node}: {other:?}")),
                },
                // Nothing mounted there (a node's token client is its mount's): it
                // holds nothing.
                Err(TransportError::NoService { .. }) => {
                    if manager.apply_report(*node, &[]) {
                        reports += 1;
                    }
                }
                Err(e) => missing.push(format!("{node}: {e}")),
            }
        }
        if !missing.is_empty() {
            if rounds == 1 || rounds % 50 == 0 {
                tracing::info!(
                    "token manager of {me}: slot {slot}'s rebuild waits for the reports of {}",
                    missing.join("; ")
                );
            }
            std::thread::sleep(REPORT_RETRY);
        }
    }
    let reported = started.elapsed();
    while manager.is_rebuilding() && !stop.load(Ordering::SeqCst) {
        std::thread::sleep(Duration::from_millis(20));
    }
    if !manager.is_rebuilding() {
        tracing::warn!(
            "token manager of {me}: slot {slot} (from {failed}) rebuilt in {} ms: {tokens} \
             tokens from {reports} node reports in {rounds} rounds ({} ms), {failed} \
             recovered; it serves the slot now",
            started.elapsed().as_millis(),
            reported.as_millis()
        );
    }
}
