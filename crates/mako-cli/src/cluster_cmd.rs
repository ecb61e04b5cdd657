//! Admin commands of a multi-process cluster (`mako up --nodes N`), in the spirit of
//! the mm* tools: `mako node show` (every node's state, like mmgetstate),
//! `mako startup|shutdown -a|-N`, and `mako config set|unset ... [-N nodes]` on the
//! replicated configuration that the quorum nodes keep.
//!
//! The CLI asks one node's makod (this data directory's own node first, then the
//! quorum nodes, then the others) over its control socket; that makod answers from its
//! member of the quorum, which forwards changes to the cluster manager (the raft
//! leader) and probes the other nodes over the network.

use std::process::ExitCode;

use anyhow::{bail, Result};
use mako_control::{ClusterConfig, ClusterView, DataDir, NodeDef, Request, Response};

use crate::cli::{Context, NodeSelection};
use crate::daemon::{expect_ok, query_status, read_pid, start_and_wait, unexpected};
use crate::nodes_cmd::stop_nodes;
use crate::table::Table;
use mako_control::same_dir;

/// How long a cluster request may take: a change waits for the quorum, at most its
/// own deadline (30 s), plus an election.
const CLUSTER_CALL_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(90);

/// The nodes in the order the CLI asks them: this directory's own node, the quorum
/// nodes, the others.
/// The nodes' names in cluster.toml, comma-separated, for an error about an unknown node.
pub fn node_names(cluster: &ClusterConfig) -> String {
    let names: Vec<&str> = cluster.nodes.iter().map(|n| n.name.as_str()).collect();
    names.join(", ")
}

fn ask_order<'a>(cluster: &'a ClusterConfig, data: &DataDir) -> Vec<&'a NodeDef> {
    let mut order: Vec<&NodeDef> = cluster.nodes.iter().collect();
    let quorum: Vec<u32> = cluster.quorum_nodes().iter().map(|n| n.id).collect();
    order.sort_by_key(|n| {
        let own = same_dir(&n.data_dir, &data.root);
        (!own, !quorum.contains(&n.id), n.id)
    });
    order
}

/// Why node `n` did not answer its control socket, in a few words.
fn local_state(n: &NodeDef) -> String {
    let dir = DataDir::new(&n.data_dir);
    match read_pid(&dir) {
        Some(pid) if crate::daemon::process_alive(pid) => {
            format!("makod (pid {pid}) does not answer")
        }
        _ => "not running".to_string(),
    }
}

/// Sends `request` to the first node whose makod answers.
pub fn call_cluster(context: &Context, request: &Request) -> Result<(String, Response)> {
    let cluster = multi(context)?;
    let mut tried = Vec::new();
    for n in ask_order(&cluster, &context.data) {
        let dir = DataDir::new(&n.data_dir);
        match crate::daemon::try_connect(&dir) {
            Ok(Some(mut client)) => {
                client.set_timeout(CLUSTER_CALL_TIMEOUT);
                match client.call(request) {
                    Ok(r) => return Ok((n.name.clone(), r)),
                    Err(e) => tried.push(format!("{}: {e}", n.name)),
                }
            }
            Ok(None) => tried.push(format!("{}: {}", n.name, local_state(n))),
            Err(e) => tried.push(format!("{}: {e:#}", n.name)),
        }
    }
    bail!(
        "no node of cluster {} answers ({}); start them with `mako startup -a`",
        cluster.cluster_name,
        tried.join("; ")
    )
}

/// The cluster.toml of this data directory, which must describe several nodes.
pub(crate) fn multi(context: &Context) -> Result<ClusterConfig> {
    let cluster = context.cluster()?;
    if cluster.nodes.is_empty() {
        bail!(
            "the cluster in {} is one makod (made by `mako up` without --nodes): it has no \
             nodes to manage; `mako status` shows it",
            context.data.root.display()
        );
    }
    Ok(cluster)
}

/// The cluster's view from the first node that answers, or why there is none.
pub fn cluster_view(context: &Context) -> Result<ClusterView> {
    let request = Request::ClusterShow;
    match call_cluster(context, &request)? {
        (_, Response::Cluster(view)) => Ok(view),
        (node, Response::Error { message }) => bail!("{node}: {message}"),
        (_, other) => Err(unexpected(&request, &other)),
    }
}

/// A node's state for a person: the raft state with the cluster manager named, or why
/// it does not answer (refined with what this machine knows of its makod).
pub fn state_text(
    view: &ClusterView,
    node: &mako_control::NodeStateView,
    def: Option<&NodeDef>,
) -> String {
    if node.answers {
        let manager = view.manager.as_deref() == Some(node.name.as_str());
        return match node.state.as_str() {
            "leader" if manager => "active, cluster manager".to_string(),
            "follower" => "active".to_string(),
            "learner" => "active (learner)".to_string(),
            other => format!("active ({other})"),
        };
    }
    match def {
        // On this machine: say whether its makod runs at all.
        // ... keeping what the cluster says of it (an expelled node that is down
        // is expelled too).
        Some(d) if d.data_dir.is_dir() && local_state(d) == "not running" => {
            match node.state.split_once("; expelled by ") {
                Some((_, expel)) => format!("down: not running; expelled by {expel}"),
                None => "down: not running".to_string(),
            }
        }
        _ => format!("down: {}", node.state),
    }
}

/// `mako node show`.
pub fn node_show(context: &Context) -> Result<ExitCode> {
    let cluster = multi(context)?;
    let view = cluster_view(context)?;
    print!("{}", render_view(&cluster, &view));
    Ok(ExitCode::SUCCESS)
}

/// The nodes table of `mako node show`.
pub fn render_view(cluster: &ClusterConfig, view: &ClusterView) -> String {
    let mut out = if view.name.is_empty() {
        format!(
            "Cluster {} (its replicated configuration is not created yet: a majority of the \
             quorum nodes must run)\n",
            cluster.cluster_name
        )
    } else {
        format!(
            "Cluster {}, configuration epoch {} (as {} has it), cluster manager: {}\n",
            view.name,
            view.epoch,
            view.answered_by,
            view.manager.as_deref().unwrap_or("none elected")
        )
    };
    let mut t = Table::new(&["Node", "Id", "Roles", "Address", "State", "Term", "Epoch"]);
    let mut down = 0;
    for n in &view.nodes {
        if !n.answers {
            down += 1;
        }
        let def = cluster.nodes.iter().find(|d| d.id == n.id);
        t.row(vec![
            n.name.clone(),
            n.id.to_string(),
            n.roles.clone(),
            n.address.clone(),
            state_text(view, n, def),
            if n.answers {
                n.term.to_string()
            } else {
                "-".into()
            },
            if n.answers {
                n.epoch.to_string()
            } else {
                "-".into()
            },
        ]);
    }
    out.push_str(&t.render());
    out.push_str(&format!(
        "{} of {} nodes active\n",
        view.nodes.len() - down,
        view.nodes.len()
    ));
    if !view.name.is_empty() {
        let fss: Vec<String> = view
            .filesystems
            .iter()
            .map(|f| format!("{} (disks {})", f.name, f.disks.join(", ")))
            .collect();
        let disks: Vec<&str> = view.disks.iter().map(|d| d.name.as_str()).collect();
        out.push_str(&format!(
            "File systems: {}\nDisks: {}\n",
            if fss.is_empty() {
                "none".to_string()
            } else {
                fss.join("; ")
            },
            if disks.is_empty() {
                "none".to_string()
            } else {
                disks.join(", ")
            }
        ));
    }
    if !view.params.is_empty() {
        out.push_str("Parameters of the replicated configuration:\n");
        let mut p = Table::new(&["Parameter", "Value", "Where"]);
        for (name, value, scope) in &view.params {
            p.row(vec![name.clone(), value.clone(), scope.clone()]);
        }
        out.push_str(&p.render());
    }
    // Which nodes serve which disks (mmlsnsd), as the replicated configuration has it.
    let served: Vec<_> = view
        .disks
        .iter()
        .filter(|d| !d.servers.is_empty())
        .collect();
    if !served.is_empty() {
        out.push_str("NSD servers (primary first):\n");
        let mut t = Table::new(&["Disk", "Servers"]);
        for d in served {
            t.row(vec![d.name.clone(), d.servers.join(",")]);
        }
        out.push_str(&t.render());
    }
    out
}

/// `mako config set|unset` of a multi-process cluster: a change of the replicated
/// configuration, cluster-wide or on `nodes`.
pub fn config_param(
    context: &Context,
    name: &str,
    value: Option<&str>,
    nodes: &[String],
) -> Result<ExitCode> {
    let request = Request::ClusterParam {
        name: name.to_string(),
        value: value.map(String::from),
        nodes: nodes.to_vec(),
    };
    change(context, &request, "")?;
    Ok(ExitCode::SUCCESS)
}

/// Sends a configuration change to the cluster manager (through any running node) and
/// prints its answer; a refusal is an error naming the node asked, followed by
/// `after_refusal` (e.g. "; nothing was deleted").
pub fn change(context: &Context, request: &Request, after_refusal: &str) -> Result<()> {
    let (node, response) = call_cluster(context, request)?;
    match response {
        Response::Error { message } => {
            bail!("{message} (asked through {node}){after_refusal}")
        }
        other => println!("{}", expect_ok(other, request)?),
    }
    Ok(())
}

/// The nodes `-a` or `-N` selects.
fn selected<'a>(cluster: &'a ClusterConfig, sel: &NodeSelection) -> Result<Vec<&'a NodeDef>> {
    if sel.all {
        return Ok(cluster.nodes.iter().collect());
    }
    if sel.nodes.is_empty() {
        bail!("name the nodes with -N NODE[,NODE...], or -a for all of them");
    }
    let mut out = Vec::new();
    for name in &sel.nodes {
        match cluster
            .nodes
            .iter()
            .find(|n| &n.name == name || n.id.to_string() == *name)
        {
            Some(n) => out.push(n),
            None => bail!(
                "-N {name}: no such node; the nodes are {}",
                node_names(cluster)
            ),
        }
    }
    Ok(out)
}

/// `mako startup -a|-N`: starts the selected nodes' makod (the manager nodes and NSD
/// servers together first; the others wait for them before they mount).
pub fn startup(context: &Context, sel: &NodeSelection) -> Result<ExitCode> {
    let cluster = multi(context)?;
    let nodes = selected(&cluster, sel)?;
    crate::nodes_cmd::start_in_order(&cluster, nodes, |n| {
        let dir = DataDir::new(&n.data_dir);
        if query_status(&dir).ok().flatten().is_some() {
            println!("{}: already running", n.name);
            return Ok(());
        }
        let own = ClusterConfig::load(&dir.root)?;
        start_and_wait(&dir, &own).map_err(|e| anyhow::anyhow!("starting {}: {e:#}", n.name))?;
        println!("{}: started", n.name);
        Ok(())
    })?;
    Ok(ExitCode::SUCCESS)
}

/// `mako shutdown -a|-N`: stops the selected nodes' makod (the manager node last: the
/// others give their tokens back to it as they unmount).
pub fn shutdown(context: &Context, sel: &NodeSelection) -> Result<ExitCode> {
    let cluster = multi(context)?;
    let nodes = selected(&cluster, sel)?;
    if let Some(manager) = nodes.iter().find(|n| n.manager) {
        let still: Vec<&str> = cluster
            .nodes
            .iter()
            .filter(|n| !nodes.iter().any(|s| s.id == n.id))
            .filter(|n| {
                query_status(&DataDir::new(&n.data_dir))
                    .ok()
                    .flatten()
                    .is_some()
            })
            .map(|n| n.name.as_str())
            .collect();
        if !still.is_empty() {
            bail!(
                "{} runs a token manager shard, and {} would go on without it (no file \
                 operation could get a token from it). Stop those first (`mako shutdown -N {}`), or \
                 every node with -a",
                manager.name,
                still.join(", "),
                still.join(",")
            );
        }
    }
    stop_nodes(nodes)
}

/// `mako fs mount|unmount NAME -a|-N` of a multi-process cluster: on each selected
/// node, through its own makod's control socket; says per node what happened, and
/// remembers in each node's cluster.toml whether it mounts the file system at start.
pub fn fs_mount_nodes(
    context: &Context,
    name: &str,
    mount: bool,
    options: &str,
    on: &crate::cli::FsNodes,
) -> Result<ExitCode> {
    let cluster = multi(context)?;
    if cluster.filesystem(name).is_none() {
        return Err(crate::fs_cmd::no_such_fs(&cluster, name));
    }
    let nodes = selected(&cluster, &on.selection())?;
    let mut failed = Vec::new();
    for n in nodes {
        match mount_on_node(n, name, mount, options) {
            Ok(said) => println!("{}: {said}", n.name),
            Err(e) => {
                println!("{}: {e:#}", n.name);
                failed.push(n.name.clone());
            }
        }
    }
    if !failed.is_empty() {
        bail!(
            "{name} was not {} on {}; see above",
            if mount { "mounted" } else { "unmounted" },
            failed.join(", ")
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// Mounts or unmounts `name` on node `n` (see [`fs_mount_nodes`]).
fn mount_on_node(n: &NodeDef, name: &str, mount: bool, options: &str) -> Result<String> {
    let dir = DataDir::new(&n.data_dir);
    let mut own = ClusterConfig::load(&dir.root)?;
    let Some(fs) = own.filesystem(name).cloned() else {
        bail!(
            "{name} is not in this node's {}; the cluster's file systems reach a node when it \
             is created or added",
            dir.cluster_file().display()
        );
    };
    let mp = fs.mountpoint.display().to_string();
    // What it does at its next start.
    let remember = |own: &mut ClusterConfig| -> Result<()> {
        if let Some(e) = own.filesystem_mut(name) {
            if e.automount != mount || (mount && e.mount_options != options) {
                e.automount = mount;
                if mount {
                    e.mount_options = options.to_string();
                }
                own.save(&dir.root)?;
            }
        }
        Ok(())
    };
    let status = match query_status(&dir) {
        Ok(Some(s)) => s,
        Ok(None) => {
            let why = local_state(n);
            remember(&mut own)?;
            if mount {
                bail!(
                    "{why}, so {name} is not mounted there now; it is set to mount when the \
                     node starts: `mako startup -N {}`",
                    n.name
                );
            }
            return Ok(format!(
                "{why}, so {name} is not mounted there; it will not be mounted at its next start"
            ));
        }
        Err(e) => bail!(
            "its makod does not answer ({e:#}), so nothing was done there; see {}",
            dir.root.join("makod.log").display()
        ),
    };
    let mounted = status
        .filesystems
        .iter()
        .any(|f| f.name == name && f.mounted);
    let request = if mount {
        if mounted && options.is_empty() {
            remember(&mut own)?;
            return Ok(format!("{name} is mounted on {mp} already"));
        }
        std::fs::create_dir_all(&fs.mountpoint)
            .map_err(|e| anyhow::anyhow!("cannot create mount point {mp}: {e}"))?;
        Request::Mount {
            fs: name.to_string(),
            mountpoint: None,
            options: options.to_string(),
        }
    } else {
        if !mounted {
            remember(&mut own)?;
            return Ok(format!("{name} is not mounted"));
        }
        Request::Unmount {
            fs: name.to_string(),
            mountpoint: None,
        }
    };
    let mut client = crate::daemon::connect(&dir)?;
    client.set_timeout(crate::daemon::MOUNT_TIMEOUT);
    let said = expect_ok(client.call(&request)?, &request)?;
    remember(&mut own)?;
    Ok(said)
}
