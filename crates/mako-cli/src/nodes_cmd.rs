//! `mako up --nodes N`, and `mako status` / `mako down` of such a cluster: N makod
//! processes on this machine, one per node, each with its own data directory
//! (`<data dir>/node<i>`), its own loopback port and its own mount point
//! (`<mount point>.node<i>`), all sharing the disk files of `<data dir>/disks`.
//!
//! The data directory given to `mako` is the cluster's overview: its cluster.toml lists
//! the disks, the file system and every node (`[[nodes]]`), and its `cluster.key` is
//! the secret the nodes authenticate each other with. Each node's directory holds a
//! copy of both with its own node number and mount point, its config.toml, makod.log,
//! makod.pid and control socket. The manager nodes (node 0 unless `mako cluster create
//! --manager-nodes` names others) run the token manager's shards, the first of them the
//! file-system manager; they start first, together with the NSD servers, and stop last.

use std::fs;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{anyhow, bail, Context as _, Result};
use mako_control::{same_dir, ClusterConfig, DataDir, NodeDef};

use crate::cli::{ClusterCreateArgs, Context, UpArgs};
use crate::daemon::{create_cluster, down_data, query_status, start_and_wait};
use crate::table::Table;
use crate::units::human_bytes;

/// Most nodes `mako up --nodes` starts on one machine.
const NODES_MAX: u32 = 16;

/// The mount point of node `i` of a file system mounted at `mountpoint`.
pub fn node_mountpoint(mountpoint: &Path, i: u32) -> PathBuf {
    let mut s = mountpoint.as_os_str().to_owned();
    s.push(format!(".node{i}"));
    PathBuf::from(s)
}

/// True if `mako up` should start a multi-process cluster: `--nodes` above 1, or the
/// data directory already holds one.
pub fn is_multi(data: &DataDir, args: &UpArgs) -> Result<bool> {
    if ClusterConfig::exists(&data.root) {
        let cluster = ClusterConfig::load(&data.root)?;
        return match (cluster.nodes.is_empty(), args.nodes) {
            (false, _) => Ok(true),
            (true, Some(n)) if n > 1 => bail!(
                "--nodes {n}: the cluster in {} was created with one node, and --nodes only \
                 applies when a cluster is created. Start a cluster of {n} nodes in another \
                 --data-dir (or remove this one after `mako down`)",
                data.root.display()
            ),
            (true, _) => Ok(false),
        };
    }
    if let Some(&i) = args
        .nsd_servers
        .iter()
        .find(|&&i| i >= args.nodes.unwrap_or(1))
    {
        bail!(
            "--nsd-servers {i}: no such node; give node numbers from 0 to {} (with --nodes)",
            args.nodes.unwrap_or(1).saturating_sub(1)
        );
    }
    if !args.nsd_servers.is_empty() && args.nodes.unwrap_or(1) < 2 {
        bail!("--nsd-servers needs a cluster of several nodes: give --nodes 2 or more");
    }
    match args.nodes {
        None | Some(1) => Ok(false),
        Some(n) if (2..=NODES_MAX).contains(&n) => Ok(true),
        Some(n) => bail!("--nodes {n}: give 1 to {NODES_MAX} nodes"),
    }
}

/// A free TCP port on 127.0.0.1 (the system picks it; the node binds it again when
/// it starts, and says so clearly if something took it meanwhile).
fn free_port() -> Result<u16> {
    let l = std::net::TcpListener::bind("127.0.0.1:0")
        .context("cannot find a free port on 127.0.0.1")?;
    Ok(l.local_addr()?.port())
}

/// A new random cluster key, hex (32 bytes from the system's random source).
fn new_key() -> Result<String> {
    let mut bytes = [0u8; 32];
    fs::File::open("/dev/urandom")
        .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut bytes))
        .context("cannot read /dev/urandom for a new cluster key")?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

/// Writes the cluster key readable by its owner only.
fn write_key(path: &Path, hex: &str) -> Result<()> {
    let mut f = fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .with_context(|| format!("cannot write the cluster key {}", path.display()))?;
    f.write_all(format!("{hex}\n").as_bytes())?;
    f.sync_all()?;
    Ok(())
}

/// The cluster.toml of node `id`: the overview with its own number, name and mount
/// points.
fn node_cluster(overview: &ClusterConfig, node: &NodeDef) -> ClusterConfig {
    let mut c = overview.clone();
    c.node_id = node.id;
    c.node_name = node.name.clone();
    for fs in &mut c.filesystems {
        fs.mountpoint = node_mountpoint(&fs.mountpoint, node.id);
    }
    c
}

/// The quorum nodes `--quorum-nodes` names (node names or numbers) among `n` nodes;
/// none named: as many of the first nodes as give the most failures survived, up to
/// five (1 or 2 nodes: node 0; 3 or 4: three; five or more: five).
fn quorum_ids(n: u32, named: &[String]) -> Result<Vec<u32>> {
    if named.is_empty() {
        let count = match n {
            0..=2 => 1,
            3..=4 => 3,
            _ => 5,
        };
        return Ok((0..count).collect());
    }
    let ids = named_ids("--quorum-nodes", n, named)?;
    if ids.len() > 7 {
        bail!(
            "--quorum-nodes: {} named; give at most 7 (1, 3 or 5 is usual: a majority must run)",
            ids.len()
        );
    }
    Ok(ids)
}

/// The manager nodes `--manager-nodes` names among `n` nodes; none named: node 0.
fn manager_ids(n: u32, named: &[String]) -> Result<Vec<u32>> {
    if named.is_empty() {
        return Ok(vec![0]);
    }
    named_ids("--manager-nodes", n, named)
}

/// The node numbers that option `flag` names (node names like node3, or numbers) among
/// `n` nodes, sorted; each at most once.
fn named_ids(flag: &str, n: u32, named: &[String]) -> Result<Vec<u32>> {
    let mut ids = Vec::new();
    for name in named {
        let id = name
            .strip_prefix("node")
            .unwrap_or(name)
            .parse::<u32>()
            .ok()
            .filter(|&i| i < n)
            .ok_or_else(|| {
                anyhow!(
                    "{flag} {name}: no such node; the nodes will be node0 to node{}",
                    n - 1
                )
            })?;
        if ids.contains(&id) {
            bail!("{flag}: node{id} is named twice");
        }
        ids.push(id);
    }
    ids.sort_unstable();
    Ok(ids)
}

/// Creates the overview and every node's data directory (`mako cluster create`, and
/// `mako up --nodes N` the first time): the disks and file system, the cluster key,
/// the node list with the quorum nodes, each node's cluster.toml and config.toml.
fn create(
    data: &DataDir,
    args: &UpArgs,
    n: u32,
    name: Option<&str>,
    quorum_names: &[String],
    manager_names: &[String],
) -> Result<ClusterConfig> {
    if let Some(name) = name {
        mako_control::cluster::validate_name("cluster name", name).map_err(|p| anyhow!(p))?;
    }
    // Checked before anything is created.
    let quorum = quorum_ids(n, quorum_names)?;
    let managers = manager_ids(n, manager_names)?;
    if let Some(m) = args.max_nodes {
        if m < n || m > NODES_MAX {
            bail!("--max-nodes {m}: give {n} (--nodes) to {NODES_MAX}");
        }
    }
    let mut cluster = create_cluster(data, args, n)?;
    if let Some(name) = name {
        cluster.cluster_name = name.to_string();
    }
    let mut nodes = Vec::new();
    for i in 0..n {
        nodes.push(NodeDef {
            id: i,
            name: format!("node{i}"),
            address: format!("127.0.0.1:{}", free_port()?),
            data_dir: crate::daemon::absolute(&data.root.join(format!("node{i}")))?,
            manager: managers.contains(&i),
            quorum: quorum.contains(&i),
            local_disks: None,
        });
    }
    cluster.node_id = 0;
    cluster.node_name = "node0".into();
    if !args.nsd_servers.is_empty() {
        // Only the servers open the disk files; every disk lists them, primary first.
        let names: Vec<String> = args
            .nsd_servers
            .iter()
            .map(|i| format!("node{i}"))
            .collect();
        for d in &mut cluster.disks {
            d.servers = names.clone();
        }
        let all: Vec<String> = cluster.disks.iter().map(|d| d.name.clone()).collect();
        for node in &mut nodes {
            node.local_disks = Some(if args.nsd_servers.contains(&node.id) {
                all.clone()
            } else {
                Vec::new()
            });
        }
    }
    cluster.nodes = nodes;
    cluster.validate()?;
    let key = new_key()?;
    write_key(&data.key_file(), &key)?;
    let config = fs::read_to_string(data.config_file()).unwrap_or_default();
    for node in &cluster.nodes {
        let dir = DataDir::new(&node.data_dir);
        fs::create_dir_all(&dir.root)
            .with_context(|| format!("cannot create {}", dir.root.display()))?;
        write_key(&dir.key_file(), &key)?;
        // Each node's own metrics port, so they do not compete for one.
        let mut store = mako_config::ConfigStore::load_or_default(dir.config_file())?;
        if !config.is_empty() {
            fs::write(dir.config_file(), &config)?;
            store = mako_config::ConfigStore::load_or_default(dir.config_file())?;
        }
        store
            .set("prometheusPort", &(9370 + node.id).to_string())
            .map_err(|e| anyhow!("node {}: prometheusPort: {e}", node.name))?;
        store.save()?;
        node_cluster(&cluster, node).save(&dir.root)?;
    }
    // Saved last: an overview with nodes exists only once every node's directory does.
    cluster.save(&data.root)?;
    Ok(cluster)
}

/// `mako cluster create`: the cluster `mako up --nodes N` would make, not started.
pub fn cluster_create(context: &Context, args: &ClusterCreateArgs) -> Result<ExitCode> {
    let data = &context.data;
    if ClusterConfig::exists(&data.root) {
        bail!(
            "a cluster exists already in {} (`mako status` shows it); create another in \
             another --data-dir",
            data.root.display()
        );
    }
    let n = match args.up.nodes {
        Some(n) if (2..=NODES_MAX).contains(&n) => n,
        Some(n) => bail!("--nodes {n}: give 2 to {NODES_MAX} nodes (one node: `mako up`)"),
        None => bail!("--nodes N: how many nodes (makod processes) the cluster has"),
    };
    let cluster = create(
        data,
        &args.up,
        n,
        args.name.as_deref(),
        &args.quorum_nodes,
        &args.manager_nodes,
    )?;
    println!(
        "Cluster {} created: {n} nodes, not started.\n",
        cluster.cluster_name
    );
    println!("  data dir     {}", data.root.display());
    println!("  cluster key  {}", data.key_file().display());
    for fs in &cluster.filesystems {
        println!("  file system  {} on {}", fs.name, fs.disks.join(", "));
    }
    let mut t = Table::new(&["Node", "Id", "Roles", "Address", "Data dir"]);
    for node in &cluster.nodes {
        let mut roles = vec![if node.manager { "manager" } else { "client" }];
        if node.quorum {
            roles.push("quorum");
        }
        t.row(vec![
            node.name.clone(),
            node.id.to_string(),
            roles.join(","),
            node.address.clone(),
            node.data_dir.display().to_string(),
        ]);
    }
    println!();
    print!("{}", t.render());
    println!("\nNext:         `mako startup -a` starts every node (the managers first)");
    Ok(ExitCode::SUCCESS)
}

/// `mako up` of a multi-process cluster.
pub fn up(context: &Context, args: &UpArgs) -> Result<ExitCode> {
    let data = &context.data;
    let cluster = if ClusterConfig::exists(&data.root) {
        let cluster = ClusterConfig::load(&data.root)?;
        if let Some(n) = args.nodes {
            if n as usize != cluster.nodes.len() {
                eprintln!(
                    "note: --nodes {n} ignored: the cluster in {} has {} nodes",
                    data.root.display(),
                    cluster.nodes.len()
                );
            }
        }
        if !args.nsd_servers.is_empty() {
            eprintln!(
                "note: --nsd-servers ignored: it only applies when a cluster is created; the \
                 disks' servers are in {}",
                data.cluster_file().display()
            );
        }
        cluster
    } else {
        let n = args.nodes.unwrap_or(1);
        create(data, args, n, None, &[], &[])?
    };
    start_in_order(&cluster, cluster.nodes.iter().collect(), |node| {
        let dir = DataDir::new(&node.data_dir);
        let own = ClusterConfig::load(&dir.root)?;
        start_and_wait(&dir, &own).with_context(|| format!("starting node {}", node.name))
    })?;
    println!("Mako is up: {} nodes.\n", cluster.nodes.len());
    println!("  cluster      {}", cluster.cluster_name);
    println!("  data dir     {}", data.root.display());
    for fs in &cluster.filesystems {
        println!("  file system  {}", fs.name);
        for disk in cluster.disks_of(fs) {
            println!(
                "    disk {:<8} {} ({}, {})",
                disk.name,
                disk.path.display(),
                human_bytes(disk.size_bytes),
                if disk.servers.is_empty() {
                    "shared by every node".to_string()
                } else {
                    format!("NSD servers {}", disk.servers.join(","))
                }
            );
        }
    }
    println!();
    print!("{}", render_nodes(&cluster, data));
    println!();
    if let Some(fs) = cluster.filesystems.iter().find(|f| f.automount) {
        let mps: Vec<String> = cluster
            .nodes
            .iter()
            .map(|n| node_mountpoint(&fs.mountpoint, n.id).display().to_string())
            .collect();
        println!("Use it:       ls {}", mps.join(" "));
    }
    println!("Next:         `mako status` to see it, `mako down` to stop it");
    Ok(ExitCode::SUCCESS)
}

/// Starts `nodes` with `start`: the manager nodes and the NSD servers together first,
/// each in its own thread (a node's mount waits for every token manager shard and for
/// its disks' servers, and a server's mount for the managers, so none of them can wait
/// for the others one after another), then the other nodes in number order. Every
/// failure of the first group is reported, not only the first one.
pub fn start_in_order(
    cluster: &ClusterConfig,
    nodes: Vec<&NodeDef>,
    start: impl Fn(&NodeDef) -> Result<()> + Sync,
) -> Result<()> {
    let serves = |n: &NodeDef| cluster.disks.iter().any(|d| d.servers.contains(&n.name));
    let (mut first, mut rest): (Vec<&NodeDef>, Vec<&NodeDef>) =
        nodes.into_iter().partition(|n| n.manager || serves(n));
    first.sort_by_key(|n| n.id);
    rest.sort_by_key(|n| n.id);
    let start = &start;
    let failures: Vec<String> = std::thread::scope(|s| {
        let running: Vec<_> = first
            .iter()
            .map(|&n| (n, s.spawn(move || start(n))))
            .collect();
        running
            .into_iter()
            .filter_map(|(n, t)| match t.join() {
                Ok(Ok(())) => None,
                Ok(Err(e)) => Some(format!("{e:#}")),
                Err(_) => Some(format!("starting {}: the starting thread panicked", n.name)),
            })
            .collect()
    });
    if !failures.is_empty() {
        bail!("{}", failures.join("\n"));
    }
    for n in rest {
        start(n)?;
    }
    Ok(())
}

/// The nodes table of `mako status` (and `mako up`): each node's makod, address and
/// mounts, asked from its own makod.
pub fn render_nodes(cluster: &ClusterConfig, data: &DataDir) -> String {
    let mut out = format!(
        "Cluster {}, {} nodes (data dir {})\n",
        cluster.cluster_name,
        cluster.nodes.len(),
        data.root.display()
    );
    // The quorum's account of every node, from the first node that answers.
    let context = Context { data: data.clone() };
    let view = match crate::cluster_cmd::cluster_view(&context) {
        Ok(v) => {
            out.push_str(&format!(
                "Cluster manager: {}; configuration epoch {}\n",
                v.manager.as_deref().unwrap_or("none elected"),
                v.epoch
            ));
            Some(v)
        }
        Err(e) => {
            out.push_str(&format!("Quorum: {e:#}\n"));
            None
        }
    };
    let mut t = Table::new(&[
        "Node",
        "Id",
        "Role",
        "Address",
        "Quorum state",
        "makod",
        "File system",
        "Mount point",
        "State",
    ]);
    for node in &cluster.nodes {
        let mut role = if node.manager { "manager" } else { "client" }.to_string();
        if cluster.quorum_nodes().iter().any(|q| q.id == node.id) {
            role.push_str(",quorum");
        }
        let quorum_state = view
            .as_ref()
            .and_then(|v| {
                v.nodes
                    .iter()
                    .find(|n| n.id == node.id)
                    .map(|n| crate::cluster_cmd::state_text(v, n, Some(node)))
            })
            .unwrap_or_else(|| "-".into());
        let dir = DataDir::new(&node.data_dir);
        let (daemon, fss) = match query_status(&dir) {
            Ok(Some(s)) => (format!("running, pid {}", s.pid), Some(s.filesystems)),
            Ok(None) => ("down".to_string(), None),
            Err(e) => (format!("not answering: {e}"), None),
        };
        for fs in &cluster.filesystems {
            let mp = node_mountpoint(&fs.mountpoint, node.id);
            let state = match &fss {
                None => "-".to_string(),
                Some(list) => match list.iter().find(|s| s.name == fs.name) {
                    Some(s) if s.mounted && s.read_only => "mounted ro".into(),
                    Some(s) if s.mounted => "mounted".into(),
                    Some(_) => "not mounted".into(),
                    None => "unknown to makod".into(),
                },
            };
            t.row(vec![
                node.name.clone(),
                node.id.to_string(),
                role.clone(),
                node.address.clone(),
                quorum_state.clone(),
                daemon.clone(),
                fs.name.clone(),
                mp.display().to_string(),
                state,
            ]);
        }
    }
    out.push_str(&t.render());
    out.push_str(&render_disk_access(cluster));
    out
}

/// Which nodes serve which disks and how every node reaches them, from cluster.toml
/// (empty when every node opens every disk itself and none is served).
pub fn render_disk_access(cluster: &ClusterConfig) -> String {
    let served = cluster.disks.iter().any(|d| !d.servers.is_empty());
    let all_local = cluster.nodes.iter().all(|n| n.local_disks.is_none());
    if !served && all_local {
        return String::new();
    }
    let mut t = Table::new(&[
        "Disk",
        "NSD servers (primary first)",
        "Local access",
        "Through a server",
    ]);
    for d in &cluster.disks {
        let (local, remote): (Vec<&NodeDef>, Vec<&NodeDef>) =
            cluster.nodes.iter().partition(|n| n.has_local(&d.name));
        let names = |v: &[&NodeDef]| {
            if v.is_empty() {
                "-".to_string()
            } else {
                v.iter()
                    .map(|n| n.name.as_str())
                    .collect::<Vec<_>>()
                    .join(",")
            }
        };
        t.row(vec![
            d.name.clone(),
            if d.servers.is_empty() {
                "-".into()
            } else {
                d.servers.join(",")
            },
            names(&local),
            if d.servers.is_empty() && !remote.is_empty() {
                format!("{} (no server: cannot mount)", names(&remote))
            } else {
                names(&remote)
            },
        ]);
    }
    format!(
        "\nDisks (which server a node uses now: `mako disk show` on it)\n{}",
        t.render()
    )
}

/// `mako down` of a multi-process cluster: every client node first, the manager last
/// (the others give their tokens back to it as they unmount).
pub fn down(context: &Context, cluster: &ClusterConfig) -> Result<ExitCode> {
    let own = cluster
        .node(cluster.node_id)
        .is_some_and(|n| same_dir(&n.data_dir, &context.data.root));
    if own {
        // Run in a node's own directory: that node only.
        return down_data(&context.data);
    }
    stop_nodes(cluster.nodes.iter().collect())
}

/// Stops these nodes' makod, clients first and the manager node last (the others give
/// their tokens back to it as they unmount); says which could not be stopped.
pub fn stop_nodes(mut order: Vec<&NodeDef>) -> Result<ExitCode> {
    order.sort_by_key(|n| (n.manager, std::cmp::Reverse(n.id)));
    let managers: Vec<&NodeDef> = order.iter().copied().filter(|n| n.manager).collect();
    let mut failed = Vec::new();
    let mut managers_unmounted = false;
    for &node in &order {
        if node.manager && managers.len() > 1 && !managers_unmounted {
            // A manager node's unmount gives its tokens back to every shard, so each
            // must unmount while every other manager still runs: unmount them all
            // first, then stop them.
            for m in &managers {
                if let Err(e) = unmount_all_on(m) {
                    println!("node {}: unmounting before the stop: {e:#}", m.name);
                }
            }
            managers_unmounted = true;
        }
        println!("node {} ({}):", node.name, node.data_dir.display());
        if let Err(e) = down_data(&DataDir::new(&node.data_dir)) {
            println!("  {e:#}");
            failed.push(node.name.clone());
        }
    }
    if !failed.is_empty() {
        bail!("could not stop {}; see above", failed.join(", "));
    }
    Ok(ExitCode::SUCCESS)
}

/// Unmounts every file system node `n`'s makod has mounted (nothing if it does not
/// run), without changing what it mounts at its next start.
fn unmount_all_on(n: &NodeDef) -> Result<()> {
    let dir = DataDir::new(&n.data_dir);
    let Some(status) = query_status(&dir)? else {
        return Ok(());
    };
    for f in status.filesystems.iter().filter(|f| f.mounted) {
        let request = mako_control::Request::Unmount {
            fs: f.name.clone(),
            mountpoint: None,
        };
        let mut client = crate::daemon::connect(&dir)?;
        client.set_timeout(crate::daemon::MOUNT_TIMEOUT);
        crate::daemon::expect_ok(client.call(&request)?, &request)?;
    }
    Ok(())
}

/// The overview data directory of a cluster of several makod processes on this
/// machine (where `mako cluster create` put every node's directory) and its
/// cluster.toml: `mako node add|remove` are run there.
fn overview(context: &Context) -> Result<(DataDir, ClusterConfig)> {
    let cluster = crate::cluster_cmd::multi(context)?;
    let own = cluster.node(cluster.node_id);
    if own.is_some_and(|n| same_dir(&n.data_dir, &context.data.root)) {
        bail!(
            "{} is node {}'s own data directory; run this in the cluster's overview data \
             directory (the --data-dir given to `mako cluster create`)",
            context.data.root.display(),
            cluster.node_name
        );
    }
    Ok((context.data.clone(), cluster))
}

/// `mako node add NAME --address IP:PORT [--roles client]` (like mmaddnode): adds the
/// node to the replicated configuration through the cluster manager, then creates its
/// data directory `<overview>/NAME` (cluster key, config.toml, its cluster.toml) and
/// lists it in every cluster.toml of the cluster on this machine. Everything that can
/// refuse is checked before the configuration changes.
pub fn node_add(
    context: &Context,
    name: &str,
    address: &str,
    roles: &[String],
) -> Result<ExitCode> {
    let (data, cluster) = overview(context)?;
    mako_control::cluster::validate_name("node name", name).map_err(|p| anyhow!(p))?;
    let addr: std::net::SocketAddr = address
        .parse()
        .map_err(|e| anyhow!("--address {address}: not IP:port ({e})"))?;
    if let Some(n) = cluster.nodes.iter().find(|n| n.name == name) {
        bail!("node {name} exists already (id {}, {})", n.id, n.address);
    }
    if let Some(n) = cluster
        .nodes
        .iter()
        .find(|n| n.address.parse::<std::net::SocketAddr>().ok() == Some(addr))
    {
        bail!("--address {address}: node {} has it already", n.name);
    }
    let id = cluster.nodes.iter().map(|n| n.id + 1).max().unwrap_or(0);
    // A node mounts only with a recovery log of its own: its number must be below each
    // file system's log count.
    for fs in &cluster.filesystems {
        let desc = crate::fs_cmd::read_descriptor(&cluster, fs)?;
        let logs = desc.metadata_inodes.log_count;
        if id >= logs {
            bail!(
                "file system {} has recovery logs for {logs} nodes (numbers 0 to {}), so a \
                 node numbered {id} could not mount it; nothing was added. A cluster that is \
                 to grow is created with room for it: `mako cluster create --nodes N \
                 --max-nodes M`",
                fs.name,
                logs - 1
            );
        }
    }
    let dir = DataDir::new(crate::daemon::absolute(&data.root.join(name))?);
    if dir.root.exists() {
        bail!(
            "{} exists already; move it away, or give the node another name",
            dir.root.display()
        );
    }
    let key = fs::read_to_string(data.key_file())
        .with_context(|| format!("reading the cluster key {}", data.key_file().display()))?;
    let serves_all = cluster.disks.iter().any(|d| !d.servers.is_empty());
    let node = NodeDef {
        id,
        name: name.to_string(),
        address: addr.to_string(),
        data_dir: dir.root.clone(),
        manager: false,
        quorum: false,
        // With NSD servers the disks are reached through them; without, every node
        // opens the shared disk files.
        local_disks: serves_all.then(Vec::new),
    };
    let request = mako_control::Request::ClusterAddNode {
        id,
        name: name.to_string(),
        address: addr.to_string(),
        roles: roles.to_vec(),
    };
    crate::cluster_cmd::change(context, &request, "; nothing was added")?;
    // The configuration has the node now: its directory and every cluster.toml.
    let files = (|| -> Result<()> {
        fs::create_dir_all(&dir.root)
            .with_context(|| format!("cannot create {}", dir.root.display()))?;
        write_key(&dir.key_file(), key.trim())?;
        let config = fs::read_to_string(data.config_file()).unwrap_or_default();
        if !config.is_empty() {
            fs::write(dir.config_file(), &config)?;
        }
        let mut store = mako_config::ConfigStore::load_or_default(dir.config_file())?;
        store
            .set("prometheusPort", &(9370 + id).to_string())
            .map_err(|e| anyhow!("prometheusPort: {e}"))?;
        store.save()?;
        let mut after = cluster.clone();
        after.nodes.push(node.clone());
        node_cluster(&after, &node).save(&dir.root)?;
        crate::fs_cmd::edit_cluster_files(context, &cluster, |c| {
            if !c.nodes.iter().any(|n| n.id == id) {
                c.nodes.push(node.clone());
            }
        })?;
        Ok(())
    })();
    if let Err(e) = files {
        bail!(
            "node {name} is in the cluster's configuration, but its files could not be \
             written: {e:#}. Fix that and run `mako node remove {name}`, then add it again"
        );
    }
    println!("  data dir     {}", dir.root.display());
    println!("Next:         `mako startup -N {name}` starts it; it mounts the file systems set to mount at start");
    Ok(ExitCode::SUCCESS)
}

/// `mako node remove NAME` (like mmdelnode): refused while the node's makod runs or a
/// file system is mounted at its mount points (its makod checks the rest: a quorum
/// node, an NSD server, a node that answers); then removed from the replicated
/// configuration and from every cluster.toml on this machine, and its cluster key
/// deleted, so it cannot start again. The rest of its data directory stays.
pub fn node_remove(context: &Context, name: &str) -> Result<ExitCode> {
    let (_, cluster) = overview(context)?;
    let Some(node) = cluster.nodes.iter().find(|n| n.name == name).cloned() else {
        bail!(
            "{name}: no such node; the nodes are {}",
            crate::cluster_cmd::node_names(&cluster)
        );
    };
    let dir = DataDir::new(&node.data_dir);
    if let Ok(Some(s)) = query_status(&dir) {
        bail!(
            "{name} is up (makod pid {}): stop it first (`mako shutdown -N {name}`), then run \
             `mako node remove {name}` again; nothing was removed",
            s.pid
        );
    }
    if let Ok(own) = ClusterConfig::load(&dir.root) {
        for fs in &own.filesystems {
            if mako_control::mount_table::is_mako_mount_of(&fs.mountpoint, &fs.name) {
                bail!(
                    "{name} still has {} mounted on {} although its makod is not running; \
                     unmount it (`fusermount3 -u {}`), then run `mako node remove {name}` \
                     again; nothing was removed",
                    fs.name,
                    fs.mountpoint.display(),
                    fs.mountpoint.display()
                );
            }
        }
    }
    let request = mako_control::Request::ClusterRemoveNode {
        name: name.to_string(),
    };
    crate::cluster_cmd::change(context, &request, "; nothing was removed")?;
    crate::fs_cmd::edit_cluster_files(context, &cluster, |c| {
        if c.node_id != node.id {
            c.nodes.retain(|n| n.id != node.id);
        }
    })?;
    match fs::remove_file(dir.key_file()) {
        Ok(()) => println!(
            "  {} deleted: the node cannot join again (the others refuse its number too)",
            dir.key_file().display()
        ),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => eprintln!(
            "warning: cannot delete {}: {e}; delete it by hand",
            dir.key_file().display()
        ),
    }
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Condvar, Mutex};
    use std::time::Duration;

    fn cluster_of(managers: &[u32], servers: &[u32], n: u32) -> ClusterConfig {
        let mut c = ClusterConfig::new("test", "node0", 0);
        for i in 0..n {
            c.nodes.push(NodeDef {
                id: i,
                name: format!("node{i}"),
                address: format!("127.0.0.1:{}", 2000 + i),
                data_dir: PathBuf::from(format!("/nonexistent/node{i}")),
                manager: managers.contains(&i),
                quorum: i == 0,
                local_disks: None,
            });
        }
        c.disks.push(mako_control::DiskDef {
            name: "d1".into(),
            path: PathBuf::from("/nonexistent/d1.img"),
            size_bytes: 1 << 30,
            pool: "system".into(),
            failure_group: 1,
            usage: "dataAndMetadata".into(),
            fs: None,
            servers: servers.iter().map(|i| format!("node{i}")).collect(),
        });
        c
    }

    /// The manager nodes and NSD servers start together: each one's start here waits
    /// until all of them have begun (as a mount waits for every shard and server), which
    /// one after another would never happen. The other nodes start after them.
    #[test]
    fn managers_and_servers_start_together_then_the_others() {
        let c = cluster_of(&[0, 2], &[3], 5);
        let begun = (Mutex::new(Vec::<u32>::new()), Condvar::new());
        let result = start_in_order(&c, c.nodes.iter().collect(), |n| {
            let (lock, cv) = &begun;
            let mut b = lock.lock().unwrap();
            b.push(n.id);
            cv.notify_all();
            if n.manager || n.id == 3 {
                let (b, timeout) = cv
                    .wait_timeout_while(b, Duration::from_secs(60), |b| b.len() < 3)
                    .unwrap();
                if timeout.timed_out() {
                    bail!("node{} waited alone: {:?} had begun", n.id, *b);
                }
            }
            Ok(())
        });
        result.unwrap();
        let order = begun.0.lock().unwrap().clone();
        let mut first: Vec<u32> = order[..3].to_vec();
        first.sort_unstable();
        assert_eq!(first, [0, 2, 3], "{order:?}");
        assert_eq!(&order[3..], [1, 4], "{order:?}");
    }

    #[test]
    fn a_failed_start_in_the_first_group_is_reported_and_stops_the_rest() {
        let c = cluster_of(&[0, 1], &[], 3);
        let started = Mutex::new(Vec::new());
        let err = start_in_order(&c, c.nodes.iter().collect(), |n| {
            started.lock().unwrap().push(n.id);
            if n.id == 1 {
                bail!("starting node1: boom");
            }
            Ok(())
        })
        .unwrap_err();
        assert!(
            format!("{err:#}").contains("starting node1: boom"),
            "{err:#}"
        );
        assert!(!started.lock().unwrap().contains(&2));
    }

    #[test]
    fn manager_nodes_are_named_or_node0() {
        assert_eq!(manager_ids(3, &[]).unwrap(), [0]);
        let named = ["node2".to_string(), "0".to_string()];
        assert_eq!(manager_ids(3, &named).unwrap(), [0, 2]);
        let err = manager_ids(3, &["node7".to_string()]).unwrap_err();
        assert!(
            err.to_string()
                .contains("--manager-nodes node7: no such node"),
            "{err}"
        );
        let err = manager_ids(3, &["node1".to_string(), "1".to_string()]).unwrap_err();
        assert!(err.to_string().contains("named twice"), "{err}");
    }
}
