//! Relations between the values of different parameters, checked whenever a complete
//! set of values is assembled (saving the store, resolving the effective configuration,
//! applying a change with `-i`).
//!
//! Relations between the *limits* of parameters are compile-time assertions in
//! `spec.rs`; this file holds the ones that depend on the values an administrator chose.

use crate::error::{ConfigError, Result};
use crate::spec::{ParamId, PARAM_COUNT};
use crate::value::Value;

/// Values of every parameter, indexed by `ParamId as usize`.
pub(crate) type Values = [Value];

fn int(values: &Values, id: ParamId) -> i64 {
    match values[id as usize] {
        Value::Int(v) => v,
        ref other => unreachable!("{} holds {other:?}, not a whole number", id.name()),
    }
}

fn millis(values: &Values, id: ParamId) -> u64 {
    match values[id as usize] {
        Value::Millis(v) => v,
        ref other => unreachable!("{} holds {other:?}, not a duration", id.name()),
    }
}

/// Checks every relation; the first one broken is reported.
pub(crate) fn check(values: &Values) -> Result<()> {
    assert_eq!(values.len(), PARAM_COUNT, "a value for every parameter");

    // 1. Each prefetch partition needs at least one prefetch thread.
    let partitions = int(values, ParamId::PrefetchPartitions);
    let threads = int(values, ParamId::PrefetchThreads);
    if partitions > threads {
        return Err(ConfigError::Relation {
            left: ParamId::PrefetchPartitions.name(),
            left_value: partitions.to_string(),
            relation: "at most",
            right: ParamId::PrefetchThreads.name().to_string(),
            right_value: threads.to_string(),
            hint: "raise prefetchThreads or lower prefetchPartitions",
        });
    }

    // 2. The cluster manager must give up pinging an expired node within the lease
    //    period, or a node could be expelled later than its lease promises.
    let ping = millis(values, ParamId::MinMissedPingTimeout);
    let lease = millis(values, ParamId::FailureDetectionTime);
    if ping > lease {
        return Err(ConfigError::Relation {
            left: ParamId::MinMissedPingTimeout.name(),
            left_value: values[ParamId::MinMissedPingTimeout as usize].to_string(),
            relation: "at most",
            right: ParamId::FailureDetectionTime.name().to_string(),
            right_value: values[ParamId::FailureDetectionTime as usize].to_string(),
            hint: "raise failureDetectionTime together with minMissedPingTimeout",
        });
    }

    // 3. A non-zero small-message share must reserve at least one connection, or the
    //    setting silently does nothing.
    let percent = int(values, ParamId::TscSmallMsgTcpConnPct);
    let connections = int(values, ParamId::MaxTcpConnsPerNodeConn);
    if percent > 0 && connections * percent / 100 < 1 {
        return Err(ConfigError::Relation {
            left: ParamId::TscSmallMsgTcpConnPct.name(),
            left_value: format!("{percent}%"),
            relation: "large enough to reserve one of",
            right: ParamId::MaxTcpConnsPerNodeConn.name().to_string(),
            right_value: connections.to_string(),
            hint: "raise maxTcpConnsPerNodeConn (the share is rounded down) \
                   or set tscSmallMsgTcpConnPct to 0",
        });
    }
    Ok(())
}

/// How many of `connections` a `percent` share reserves for small messages (rounded
/// down, as in the seeds).
pub fn reserved_small_message_connections(connections: i64, percent: i64) -> i64 {
    connections * percent / 100
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::PARAMS;

    fn defaults() -> Vec<Value> {
        PARAMS.iter().map(|p| p.default.value()).collect()
    }

    #[test]
    fn defaults_satisfy_every_relation() {
        check(&defaults()).unwrap();
    }

    #[test]
    fn partitions_beyond_threads_are_refused() {
        let mut values = defaults();
        values[ParamId::PrefetchPartitions as usize] = Value::Int(8);
        values[ParamId::PrefetchThreads as usize] = Value::Int(4);
        let message = check(&values).unwrap_err().to_string();
        assert_eq!(
            message,
            "inconsistent configuration: prefetchPartitions (8) must be at most \
             prefetchThreads (4); raise prefetchThreads or lower prefetchPartitions"
        );
    }

    #[test]
    fn ping_timeout_beyond_lease_is_refused() {
        let mut values = defaults();
        values[ParamId::MinMissedPingTimeout as usize] = Value::Millis(60_000);
        let message = check(&values).unwrap_err().to_string();
        assert!(message.contains("minMissedPingTimeout (1m)"), "{message}");
        assert!(message.contains("failureDetectionTime (35s)"), "{message}");
        // The seeds' pair of settings is consistent.
        values[ParamId::FailureDetectionTime as usize] = Value::Millis(60_000);
        check(&values).unwrap();
    }

    #[test]
    fn a_share_that_reserves_nothing_is_refused() {
        let mut values = defaults();
        values[ParamId::MaxTcpConnsPerNodeConn as usize] = Value::Int(1);
        let message = check(&values).unwrap_err().to_string();
        assert!(message.contains("tscSmallMsgTcpConnPct (50%)"), "{message}");
        values[ParamId::TscSmallMsgTcpConnPct as usize] = Value::Int(0);
        check(&values).unwrap();
        assert_eq!(reserved_small_message_connections(2, 50), 1);
        assert_eq!(reserved_small_message_connections(7, 30), 2);
    }
}
