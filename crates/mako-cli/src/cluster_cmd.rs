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
use crate::nodes_cmd::{same_dir, stop_nodes};
use crate::table::Table;

/// How long a cluster request may take: a change waits for the quorum, at most its
/// own deadline (30 s), plus an election.
const CLUSTER_CALL_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(90);

/// The nodes in the order the CLI asks them: this directory's own node, the quorum
/// nodes, the others.
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
fn multi(context: &Context) -> Result<ClusterConfig> {
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
        Some(d) if d.data_dir.is_dir() && local_state(d) == "not running" => {
            "down: not running".to_string()
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
    let (node, response) = call_cluster(context, &request)?;
    match response {
        Response::Error { message } => bail!("{message} (asked through {node})"),
        other => println!("{}", expect_ok(other, &request)?),
    }
    Ok(ExitCode::SUCCESS)
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
                cluster
                    .nodes
                    .iter()
                    .map(|n| n.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        }
    }
    Ok(out)
}

/// `mako startup -a|-N`: starts the selected nodes' makod (the manager node first; the
/// others wait for it before they mount).
pub fn startup(context: &Context, sel: &NodeSelection) -> Result<ExitCode> {
    let cluster = multi(context)?;
    let mut nodes = selected(&cluster, sel)?;
    nodes.sort_by_key(|n| (!n.manager, n.id));
    for n in nodes {
        let dir = DataDir::new(&n.data_dir);
        if query_status(&dir).ok().flatten().is_some() {
            println!("{}: already running", n.name);
            continue;
        }
        let own = ClusterConfig::load(&dir.root)?;
        start_and_wait(&dir, &own).map_err(|e| anyhow::anyhow!("starting {}: {e:#}", n.name))?;
        println!("{}: started", n.name);
    }
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
                "{} runs the token manager, and {} would go on without it (no file \
                 operation could get a token). Stop those first (`mako shutdown -N {}`), or \
                 every node with -a",
                manager.name,
                still.join(", "),
                still.join(",")
            );
        }
    }
    stop_nodes(nodes)
}
