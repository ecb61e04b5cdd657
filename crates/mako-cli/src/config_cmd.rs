//! `mako config set|show|explain|unset`: the parameters of `DIR/config.toml`
//! (mako-config's `ConfigStore`); `set -i` also changes the running daemon.

use std::process::ExitCode;

use anyhow::{anyhow, Result};
use mako_config::{Apply, ConfigStore, EffectiveConfig};
use mako_control::Request;

use crate::cli::{ConfigCommand, Context};
use crate::daemon;
use crate::table::Table;

/// Runs one `mako config` command.
pub fn run(context: &Context, command: ConfigCommand) -> Result<ExitCode> {
    let path = context.data.config_file();
    match command {
        ConfigCommand::Set {
            assignment,
            immediate,
            nodes,
        } => {
            let (name, value) = mako_config::parse_assignment(&assignment)?;
            if is_multi(context) {
                // A cluster's values live in its replicated configuration.
                return crate::cluster_cmd::config_param(context, name, Some(value), &nodes);
            }
            refuse_nodes(context, &nodes)?;
            set(context, name, value, immediate)
        }
        ConfigCommand::Show { name } => {
            let store = ConfigStore::load_or_default(&path)?;
            let effective = EffectiveConfig::resolve(Some(&store), &[])?;
            let rows = effective.show_table();
            let rows: Vec<_> = match &name {
                Some(name) => {
                    let spec = mako_config::lookup(name)?;
                    rows.into_iter().filter(|r| r.name == spec.name).collect()
                }
                None => rows,
            };
            let mut table = Table::new(&[
                "Parameter",
                "Value",
                "Source",
                "Default",
                "Range",
                "Changes",
            ]);
            for row in rows {
                table.row(vec![
                    row.name.to_string(),
                    row.value,
                    row.source.to_string(),
                    row.default,
                    row.range,
                    apply_name(row.apply).to_string(),
                ]);
            }
            print!("{}", table.render());
            println!(
                "\nStored in {}. The running daemon's values: `mako diag config`. \
                 Details: `mako config explain NAME`.",
                path.display()
            );
            Ok(ExitCode::SUCCESS)
        }
        ConfigCommand::Explain { name } => {
            let store = ConfigStore::load_or_default(&path)?;
            let effective = EffectiveConfig::resolve(Some(&store), &[])?;
            print!("{}", effective.explain(&name)?);
            Ok(ExitCode::SUCCESS)
        }
        ConfigCommand::Unset { name, nodes } => {
            if is_multi(context) {
                return crate::cluster_cmd::config_param(context, &name, None, &nodes);
            }
            refuse_nodes(context, &nodes)?;
            let mut store = ConfigStore::load_or_default(&path)?;
            let spec = mako_config::lookup(&name)?;
            let previous = store.unset(&name)?;
            let Some(previous) = previous else {
                println!(
                    "{} is not set in {}; it is at its default ({}). Nothing changed.",
                    spec.name,
                    path.display(),
                    spec.default.value()
                );
                return Ok(ExitCode::SUCCESS);
            };
            store.save()?;
            println!(
                "{}: {previous} removed from {}; back to the default {}.",
                spec.name,
                path.display(),
                spec.default.value()
            );
            println!("{}", when_effective(spec.apply, spec.name));
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// True if the data directory holds a cluster of several makod processes.
fn is_multi(context: &Context) -> bool {
    context
        .cluster()
        .map(|c| !c.nodes.is_empty())
        .unwrap_or(false)
}

fn refuse_nodes(context: &Context, nodes: &[String]) -> Result<()> {
    if nodes.is_empty() {
        return Ok(());
    }
    Err(anyhow!(
        "-N {}: the cluster in {} is one makod, without other nodes; leave -N out",
        nodes.join(","),
        context.data.root.display()
    ))
}

fn apply_name(apply: Apply) -> &'static str {
    match apply {
        Apply::Immediate => "immediate",
        Apply::Restart => "restart",
    }
}

fn when_effective(apply: Apply, name: &str) -> String {
    match apply {
        Apply::Restart => format!(
            "{name} is read when makod starts: restart with `mako down && mako up` to use it."
        ),
        Apply::Immediate => format!(
            "makod uses it from its next start; `mako config set {name}=VALUE -i` also changes \
             the running daemon."
        ),
    }
}

/// `mako config set NAME=VALUE [-i]`.
fn set(context: &Context, name: &str, value: &str, immediate: bool) -> Result<ExitCode> {
    let path = context.data.config_file();
    let mut store = ConfigStore::load_or_default(&path)?;
    let outcome = store.set(name, value)?;
    store.save()?;
    let spec = outcome.param.spec();
    let before = match &outcome.previous {
        Some(previous) => format!("was {previous}"),
        None => format!("was the default {}", spec.default.value()),
    };
    println!(
        "{} = {} saved in {} ({before}).",
        spec.name,
        outcome.value,
        path.display()
    );
    if !immediate {
        println!("{}", when_effective(outcome.apply, spec.name));
        return Ok(ExitCode::SUCCESS);
    }
    if outcome.needs_restart() {
        println!(
            "{} cannot change while makod runs (-i ignored); it takes effect after \
             `mako down && mako up`.",
            spec.name
        );
        return Ok(ExitCode::SUCCESS);
    }
    if daemon::try_connect(&context.data)?.is_none() {
        println!("makod is not running; it will use the new value when it starts (`mako up`).");
        return Ok(ExitCode::SUCCESS);
    }
    let request = Request::ConfigSet {
        name: spec.name.to_string(),
        value: outcome.value.to_string(),
        immediate: true,
    };
    let message = daemon::call_ok(context, &request).map_err(|e| {
        anyhow!(
            "{e:#}\nThe value is saved in {} and takes effect at the next start.",
            path.display()
        )
    })?;
    if message.is_empty() {
        println!("Running makod now uses {} = {}.", spec.name, outcome.value);
    } else {
        println!("{message}");
    }
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn context(dir: &std::path::Path) -> Context {
        Context {
            data: mako_control::DataDir::new(dir),
        }
    }

    #[test]
    fn set_refuses_out_of_range_with_the_range() {
        let dir = tempfile::tempdir().unwrap();
        let ctx = context(dir.path());
        let error = run(
            &ctx,
            ConfigCommand::Set {
                assignment: "pagepool=1K".into(),
                immediate: false,
                nodes: Vec::new(),
            },
        )
        .unwrap_err()
        .to_string();
        assert!(error.contains("pagepool"), "{error}");
        assert!(error.contains("64M..256G"), "{error}");
        assert!(!ctx.data.config_file().exists(), "nothing saved");
    }

    #[test]
    fn set_show_unset_round_trip() {
        let dir = tempfile::tempdir().unwrap();
        let ctx = context(dir.path());
        run(
            &ctx,
            ConfigCommand::Set {
                assignment: "pagepool=2G".into(),
                immediate: false,
                nodes: Vec::new(),
            },
        )
        .unwrap();
        let store = ConfigStore::load(ctx.data.config_file()).unwrap();
        assert_eq!(
            store.get("pagepool").unwrap().map(|v| v.to_string()),
            Some("2G".to_string())
        );
        // -i on a restart parameter, and -i on an immediate one with no daemon, both save.
        run(
            &ctx,
            ConfigCommand::Set {
                assignment: "pagepool=3G".into(),
                immediate: true,
                nodes: Vec::new(),
            },
        )
        .unwrap();
        run(
            &ctx,
            ConfigCommand::Set {
                assignment: "maxMBpS=4096".into(),
                immediate: true,
                nodes: Vec::new(),
            },
        )
        .unwrap();
        run(&ctx, ConfigCommand::Show { name: None }).unwrap();
        run(
            &ctx,
            ConfigCommand::Show {
                name: Some("pagepool".into()),
            },
        )
        .unwrap();
        run(
            &ctx,
            ConfigCommand::Explain {
                name: "maxMBpS".into(),
            },
        )
        .unwrap();
        run(
            &ctx,
            ConfigCommand::Unset {
                name: "pagepool".into(),
                nodes: Vec::new(),
            },
        )
        .unwrap();
        let store = ConfigStore::load(ctx.data.config_file()).unwrap();
        assert_eq!(store.get("pagepool").unwrap(), None);
        let error = run(
            &ctx,
            ConfigCommand::Explain {
                name: "pagepol".into(),
            },
        )
        .unwrap_err()
        .to_string();
        assert!(error.contains("did you mean `pagepool`"), "{error}");
        let error = run(
            &ctx,
            ConfigCommand::Set {
                assignment: "pagepool".into(),
                immediate: false,
                nodes: Vec::new(),
            },
        )
        .unwrap_err()
        .to_string();
        assert!(error.contains("NAME=VALUE"), "{error}");
    }
}
