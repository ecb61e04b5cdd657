//! The simulated network: every call is delayed by a seeded latency on the way there
//! and back, so concurrent messages overtake each other; the handler runs on the
//! calling task's thread as the target node (its locks and tokens are the target's).
//! Counters say how many messages each node sent and received, per service.

use crate::rng::SimRng;
use crate::sched::Sim;
use mako_rt::{CallOptions, NodeId, Registry, ServiceId, Transport, TransportError};
use parking_lot::Mutex;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

/// Latency of one message, drawn uniformly from `[min, max]` per message; with
/// probability `spike_probability` a message is slow instead (up to `spike_max`: a
/// congested link, a retransmission), so that many others overtake it.
#[derive(Clone, Copy, Debug)]
pub struct NetConfig {
    pub latency_min: Duration,
    pub latency_max: Duration,
    pub spike_probability: f64,
    pub spike_max: Duration,
    /// Probability that a call between two nodes loses a message: the connection it
    /// went over broke (a packet the network drops is only latency to TCP, a spike;
    /// what the real transport turns into an error is a broken connection). Half of
    /// them lose the request (the handler never runs), half the reply (it ran); either
    /// way the caller gets `TransportError::Unreachable` at once, as `TcpTransport`
    /// fails every call of a connection that closes. Lease messages are spared
    /// (`faults_spare_leases`).
    pub loss_probability: f64,
    /// Probability that a call's request is handled twice, the second copy right after
    /// the first, before the reply leaves (a layer that resent a request it thought
    /// lost). `TcpTransport` never resends a request it has queued, so this cannot
    /// happen in a real cluster; the simulation checks that it would do no harm.
    pub duplicate_probability: f64,
    /// TEST ONLY: a duplicated request arrives late instead, after its caller got the
    /// reply and went on (overtaken by the caller's next messages). The checker's own
    /// test: handling a stale relinquish or acquire again breaks the token protocol.
    pub duplicate_late: bool,
}

impl Default for NetConfig {
    fn default() -> Self {
        NetConfig {
            latency_min: Duration::from_micros(20),
            latency_max: Duration::from_micros(300),
            spike_probability: 0.02,
            spike_max: Duration::from_millis(3),
            loss_probability: 0.0,
            duplicate_probability: 0.0,
            duplicate_late: false,
        }
    }
}

/// Message counts (requests and replies each count one).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NetStats {
    pub messages: u64,
    pub bytes: u64,
    /// Messages sent by each node (requests it made, replies it gave).
    pub sent_by: BTreeMap<NodeId, u64>,
    /// Requests per service.
    pub by_service: BTreeMap<ServiceId, u64>,
    /// Token requests by what they ask and the kind of object (`acquire dirbucket`,
    /// `revoke inode`, ...): where the token traffic of a workload goes.
    pub by_token_request: BTreeMap<String, u64>,
    /// Calls that lost their request or their reply (`NetConfig::loss_probability`),
    /// by calling node.
    pub lost_by: BTreeMap<NodeId, u64>,
    /// Requests handled twice (`NetConfig::duplicate_probability`).
    pub duplicated: u64,
}

impl NetStats {
    /// The node that sent the most messages, and how many.
    pub fn busiest(&self) -> Option<(NodeId, u64)> {
        self.sent_by
            .iter()
            .max_by_key(|(n, c)| (**c, std::cmp::Reverse(**n)))
            .map(|(n, c)| (*n, *c))
    }
}

/// The network of one simulation: shared by every node's transport.
pub struct SimNet {
    sim: Sim,
    config: NetConfig,
    registry: Arc<Registry>,
    rng: Mutex<SimRng>,
    stats: Mutex<NetStats>,
    /// Per node: its epoch (a transport made before the node's last crash belongs to
    /// an older one and reaches nobody), and whether it is down (crashed).
    nodes: Mutex<std::collections::BTreeMap<NodeId, (u64, bool)>>,
    /// Nodes cut off from every other node (a network partition of one node): nothing
    /// it sends arrives, nothing sent to it arrives, until the partition heals.
    cut: Mutex<std::collections::BTreeSet<NodeId>>,
    /// A node whose failed calls to it count as lost messages of the caller
    /// (`set_lossy_target`).
    lossy_target: Mutex<Option<NodeId>>,
    /// Expelled nodes: a call waiting for one of them to run again gives up
    /// (`give_up_on`).
    given_up: Mutex<std::collections::BTreeSet<NodeId>>,
}

impl SimNet {
    pub fn new(sim: &Sim, config: NetConfig) -> Arc<SimNet> {
        Arc::new(SimNet {
            rng: Mutex::new(sim.fork_rng()),
            sim: sim.clone(),
            config,
            registry: Registry::new(),
            stats: Mutex::new(NetStats::default()),
            nodes: Mutex::new(Default::default()),
            cut: Mutex::new(Default::default()),
            lossy_target: Mutex::new(None),
            given_up: Mutex::new(Default::default()),
        })
    }

    /// Calls to `node` that fail (cut off, stopped past the caller's deadline, its
    /// service gone) count as lost messages of the caller from now on: the caller's
    /// operations that fail are uncertain (they may or may not have taken effect) and
    /// are checked by running them again. For a fault of the token manager's node,
    /// whose requests fail with EIO until another node serves the manager.
    pub fn set_lossy_target(&self, node: NodeId) {
        *self.lossy_target.lock() = Some(node);
    }

    /// `node` was expelled: a call waiting for it (stopped, `Sim::pause_group`) fails
    /// now as unreachable instead of at its deadline. Whatever the request did there is
    /// the expelled node's, which recovery undoes or keeps; a token manager's table is
    /// rebuilt by its successor from what the survivors hold.
    pub fn give_up_on(&self, node: NodeId) {
        self.given_up.lock().insert(node);
    }

    /// `node` rejoined: calls to it wait for it again.
    pub fn stop_giving_up_on(&self, node: NodeId) {
        self.given_up.lock().remove(&node);
    }

    /// Cut `node` off from every other node (a partition of one node).
    pub fn partition(&self, node: NodeId) {
        self.cut.lock().insert(node);
    }

    /// The partition of `node` heals.
    pub fn heal(&self, node: NodeId) {
        self.cut.lock().remove(&node);
    }

    /// A message between `from` and `to` crosses a cut link: it is lost.
    fn crosses_cut(&self, from: NodeId, to: NodeId) -> Result<(), TransportError> {
        let cut = self.cut.lock();
        if from != to && (cut.contains(&from) || cut.contains(&to)) {
            return Err(TransportError::Unreachable {
                node: to,
                reason: format!("the network between {from} and {to} is partitioned"),
            });
        }
        Ok(())
    }

    /// A message for `to`, a node whose process is stopped (`Sim::pause_group`), waits
    /// in its socket until it runs again, or until the caller's deadline (from
    /// `since`) passes: then the call times out.
    fn wait_while_paused(
        &self,
        to: NodeId,
        service: ServiceId,
        since: Duration,
        deadline: Duration,
    ) -> Result<(), TransportError> {
        while self.sim.is_paused(to.0) {
            if self.given_up.lock().contains(&to) {
                return Err(TransportError::Unreachable {
                    node: to,
                    reason: "it was expelled while this call waited for its answer".into(),
                });
            }
            let now = mako_diag::sched::current().map_or(since, |s| s.now());
            let waited = now.saturating_sub(since);
            if waited >= deadline {
                return Err(TransportError::Timeout {
                    node: to,
                    service,
                    deadline,
                });
            }
            mako_diag::sched::sleep((deadline - waited).min(Duration::from_millis(2)));
        }
        Ok(())
    }

    /// `node` crashed: from now on nothing it sends arrives and nothing sent to it is
    /// answered (a call in flight to or from it loses its reply).
    pub fn crash(&self, node: NodeId) {
        self.nodes.lock().entry(node).or_default().1 = true;
    }

    /// `node` comes back with a new epoch: transports made before stay cut off.
    pub fn rejoin(&self, node: NodeId) {
        let mut nodes = self.nodes.lock();
        let e = nodes.entry(node).or_default();
        *e = (e.0 + 1, false);
    }

    /// Whether a call between `from` (a transport of epoch `epoch`) and `to` gets
    /// through.
    fn reaches(&self, from: NodeId, epoch: u64, to: NodeId) -> Result<(), TransportError> {
        let nodes = self.nodes.lock();
        let (e, down) = nodes.get(&from).copied().unwrap_or_default();
        if down || e != epoch {
            return Err(TransportError::Unreachable {
                node: to,
                reason: format!("the sender, {from}, has crashed"),
            });
        }
        if nodes.get(&to).is_some_and(|(_, down)| *down) {
            return Err(TransportError::Unreachable {
                node: to,
                reason: "it has crashed".into(),
            });
        }
        Ok(())
    }

    pub fn registry(&self) -> &Arc<Registry> {
        &self.registry
    }

    /// A transport for `node`.
    pub fn transport(self: &Arc<Self>, node: NodeId) -> Arc<SimTransport> {
        Arc::new(SimTransport {
            me: node,
            epoch: self.nodes.lock().get(&node).map_or(0, |n| n.0),
            net: self.clone(),
        })
    }

    /// Serve `manager` as `node`'s token manager, telling queued requesters their turn
    /// (`TokenManager::notify_through`) through the returned transport, which the
    /// caller keeps for as long as the manager serves (the manager holds it weakly).
    pub fn serve_token_manager(
        self: &Arc<Self>,
        node: NodeId,
        manager: Arc<mako_token::TokenManager>,
    ) -> Arc<dyn Transport> {
        let transport: Arc<dyn Transport> = self.transport(node);
        manager.notify_through(Arc::downgrade(&transport));
        self.registry.register(
            node,
            ServiceId::TokenManager,
            Arc::new(mako_token::ManagerService { manager }),
        );
        transport
    }

    pub fn stats(&self) -> NetStats {
        self.stats.lock().clone()
    }

    pub fn reset_stats(&self) {
        *self.stats.lock() = NetStats::default();
    }

    fn latency(&self) -> Duration {
        let c = &self.config;
        let lo = c.latency_min.as_nanos() as u64;
        let hi = c.latency_max.as_nanos() as u64;
        let mut rng = self.rng.lock();
        if c.spike_probability > 0.0 && rng.chance(c.spike_probability) {
            let top = (c.spike_max.as_nanos() as u64).max(hi);
            return Duration::from_nanos(rng.range(hi, top));
        }
        Duration::from_nanos(rng.range(lo, hi.max(lo)))
    }

    /// What the network does to one call from `from` to `to`: nothing, lose its
    /// request, lose its reply, or handle its request twice.
    fn fault(&self, from: NodeId, to: NodeId, service: ServiceId) -> Fault {
        let c = &self.config;
        if from == to
            || (c.loss_probability <= 0.0 && c.duplicate_probability <= 0.0)
            || service == ServiceId::Lease
        {
            return Fault::None;
        }
        let mut rng = self.rng.lock();
        let fault = if c.loss_probability > 0.0 && rng.chance(c.loss_probability) {
            if rng.chance(0.5) {
                Fault::LoseRequest
            } else {
                Fault::LoseReply
            }
        } else if c.duplicate_probability > 0.0 && rng.chance(c.duplicate_probability) {
            Fault::Duplicate
        } else {
            Fault::None
        };
        drop(rng);
        let mut s = self.stats.lock();
        match fault {
            Fault::LoseRequest | Fault::LoseReply => *s.lost_by.entry(from).or_default() += 1,
            Fault::Duplicate => s.duplicated += 1,
            Fault::None => {}
        }
        fault
    }

    /// Calls of `node` that lost a message so far.
    pub fn lost_by(&self, node: NodeId) -> u64 {
        self.stats.lock().lost_by.get(&node).copied().unwrap_or(0)
    }

    fn count(&self, from: NodeId, service: Option<ServiceId>, bytes: usize) {
        self.count_request(from, service, bytes, None)
    }

    fn count_request(
        &self,
        from: NodeId,
        service: Option<ServiceId>,
        bytes: usize,
        label: Option<String>,
    ) {
        let mut s = self.stats.lock();
        if let Some(label) = label {
            *s.by_token_request.entry(label).or_default() += 1;
        }
        s.messages += 1;
        s.bytes += bytes as u64;
        *s.sent_by.entry(from).or_default() += 1;
        if let Some(service) = service {
            *s.by_service.entry(service).or_default() += 1;
        }
    }
}

/// What the network does to one call (`SimNet::fault`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fault {
    None,
    LoseRequest,
    LoseReply,
    Duplicate,
}

/// The error a caller gets for a call whose connection broke.
fn broken(to: NodeId, what: &str) -> TransportError {
    TransportError::Unreachable {
        node: to,
        reason: format!("the connection closed (simulated message loss: the {what} was lost)"),
    }
}

/// What a token request asks, for `NetStats::by_token_request`.
fn token_label(service: ServiceId, request: &[u8]) -> Option<String> {
    use mako_token::{ClientRequest, ManagerRequest};
    match service {
        ServiceId::TokenManager => {
            let r: ManagerRequest = mako_rt::decode("token request", request).ok()?;
            Some(match r {
                ManagerRequest::Acquire(a) => format!(
                    "acquire {} {:?}{}",
                    a.resource.kind.as_str(),
                    a.mode,
                    if a.resource.kind.is_ranged() && a.required == mako_token::ByteRange::WHOLE {
                        " whole"
                    } else {
                        ""
                    }
                ),
                ManagerRequest::Relinquish { resource, .. } => {
                    format!("relinquish {}", resource.kind.as_str())
                }
                ManagerRequest::Downgrade { resource, .. } => {
                    format!("downgrade {}", resource.kind.as_str())
                }
                ManagerRequest::LocateMetanode { .. } => "locate metanode".into(),
                ManagerRequest::ResignMetanode { .. } => "resign metanode".into(),
                ManagerRequest::SetVersion { resource, .. } => {
                    format!("set version {}", resource.kind.as_str())
                }
                other => format!("{other:?}")
                    .split([' ', '(', '{'])
                    .next()?
                    .to_string(),
            })
        }
        ServiceId::TokenClient => {
            let r: ClientRequest = mako_rt::decode("revoke", request).ok()?;
            Some(match r {
                ClientRequest::Revoke {
                    resource, wanted, ..
                } => format!("revoke {} to {wanted:?}", resource.kind.as_str()),
                ClientRequest::Ping => "ping".into(),
                ClientRequest::PingWaiting(r) => format!("ping waiting {}", r.kind.as_str()),
                ClientRequest::Turn { resource, .. } => format!("turn {}", resource.kind.as_str()),
                ClientRequest::HeldIn { .. } => "held in".into(),
            })
        }
        _ => None,
    }
}

/// One node's end of the simulated network.
#[derive(Clone)]
pub struct SimTransport {
    me: NodeId,
    epoch: u64,
    net: Arc<SimNet>,
}

impl SimTransport {
    fn call_once(
        &self,
        to: NodeId,
        service: ServiceId,
        request: Vec<u8>,
        options: CallOptions,
    ) -> Result<Vec<u8>, TransportError> {
        let net = &self.net;
        let since = mako_diag::sched::current().map_or(Duration::ZERO, |s| s.now());
        net.count_request(
            self.me,
            Some(service),
            request.len(),
            token_label(service, &request),
        );
        mako_diag::sched::sleep(net.latency());
        net.reaches(self.me, self.epoch, to)?;
        net.crosses_cut(self.me, to)?;
        if to != self.me {
            net.wait_while_paused(to, service, since, options.deadline)?;
        }
        let handler = net
            .registry
            .service(to, service)
            .ok_or(TransportError::NoService { node: to, service })?;
        net.registry.admit_call(self.me, to, service)?;
        let fault = net.fault(self.me, to, service);
        if fault == Fault::LoseRequest {
            return Err(broken(to, "request"));
        }
        let reply = handler.handle(self.me, &request);
        if fault == Fault::Duplicate {
            if net.config.duplicate_late {
                // TEST ONLY: the copy arrives after the caller went on.
                let (handler, from, request) = (handler.clone(), self.me, request.clone());
                let delay = net.latency() * 20;
                net.sim.spawn(format!("{}-dup-{}", from.0, to.0), move || {
                    mako_diag::sched::sleep(delay);
                    let _ = handler.handle(from, &request);
                });
            } else {
                mako_diag::sched::sleep(net.latency());
                let _ = handler.handle(self.me, &request);
            }
        }
        if fault == Fault::LoseReply {
            return Err(broken(to, "reply"));
        }
        // A node stopped while it handled the request answers once it runs again.
        if to != self.me {
            net.wait_while_paused(to, service, since, options.deadline)?;
        }
        net.count(to, None, reply.len());
        mako_diag::sched::sleep(net.latency());
        // A node that crashed meanwhile sends no reply (and gets none).
        net.reaches(self.me, self.epoch, to)?;
        net.crosses_cut(to, self.me)?;
        Ok(reply)
    }
}

impl Transport for SimTransport {
    fn local_node(&self) -> NodeId {
        self.me
    }

    fn call(
        &self,
        to: NodeId,
        service: ServiceId,
        request: Vec<u8>,
        options: CallOptions,
    ) -> Result<Vec<u8>, TransportError> {
        let r = self.call_once(to, service, request, options);
        if r.is_err() && to != self.me && *self.net.lossy_target.lock() == Some(to) {
            *self.net.stats.lock().lost_by.entry(self.me).or_default() += 1;
        }
        r
    }

    /// A task of its own makes the call; nobody waits for it.
    fn post(&self, to: NodeId, service: ServiceId, request: Vec<u8>, options: CallOptions) {
        let t = self.clone();
        self.net
            .sim
            .spawn(format!("{}-post-{}", self.me.0, to.0), move || {
                let _ = t.call(to, service, request, options);
            });
    }

    fn call_many(
        &self,
        calls: Vec<(NodeId, ServiceId, Vec<u8>)>,
        options: CallOptions,
    ) -> Vec<Result<Vec<u8>, TransportError>> {
        if calls.len() <= 1 {
            return calls
                .into_iter()
                .map(|(to, s, r)| self.call(to, s, r, options))
                .collect();
        }
        // Overlapped: one task per call, the caller waits for all of them.
        let n = calls.len();
        type Slot = Option<Result<Vec<u8>, TransportError>>;
        let results: Arc<Mutex<Vec<Slot>>> = Arc::new(Mutex::new(vec![None; n]));
        for (i, (to, service, request)) in calls.into_iter().enumerate() {
            let results = results.clone();
            let t = self.clone();
            self.net
                .sim
                .spawn(format!("{}-call-{}-{i}", self.me.0, to.0), move || {
                    let r = t.call(to, service, request, options);
                    results.lock()[i] = Some(r);
                });
        }
        mako_diag::sched::wait_until("parallel calls", || {
            results.lock().iter().all(|r| r.is_some())
        });
        let mut out = results.lock();
        out.iter_mut()
            .map(|r| {
                r.take().unwrap_or(Err(TransportError::Unreachable {
                    node: self.me,
                    reason: "lost result".into(),
                }))
            })
            .collect()
    }
}
