//! The `FELIX_GROUP_*` variables: consumer-group limits (docs/groups.md).
//!
//! | Variable | Meaning | Default |
//! | --- | --- | --- |
//! | `FELIX_GROUP_MAX_ATTEMPTS` | deliveries of a record before it is dead-lettered instead | 5 |
//! | `FELIX_GROUP_VISIBILITY_TIMEOUT_MS` | how long a claim stands when the poll does not say | 30000 |
//! | `FELIX_GROUP_MAX_VISIBILITY_MS` | ceiling on a poll's visibility, an extension, a nack's delay | 43200000 |
//! | `FELIX_GROUP_MAX_WAIT_MS` | ceiling on a poll's `wait_ms` | 30000 |
//! | `FELIX_GROUP_MAX_IN_FLIGHT` | records a group has out and unfinished, per shard | 10000 |

use std::time::Duration;

use felix_engine::GroupConfig;

use super::ConfigError;

/// Reads the group variables into `groups`; every value must be above zero.
pub(super) fn groups_from_vars(
    number: &impl Fn(&str) -> Result<Option<u64>, ConfigError>,
    groups: &mut GroupConfig,
) -> Result<(), ConfigError> {
    let positive = |name: &str| -> Result<Option<u64>, ConfigError> {
        match number(name)? {
            Some(0) => Err(ConfigError(format!("{name} must be above zero"))),
            other => Ok(other),
        }
    };
    if let Some(n) = positive("FELIX_GROUP_MAX_ATTEMPTS")? {
        groups.max_attempts = u32::try_from(n)
            .map_err(|_| ConfigError(format!("FELIX_GROUP_MAX_ATTEMPTS={n} is out of range")))?;
    }
    if let Some(ms) = positive("FELIX_GROUP_VISIBILITY_TIMEOUT_MS")? {
        groups.visibility_timeout = Duration::from_millis(ms);
    }
    if let Some(ms) = positive("FELIX_GROUP_MAX_VISIBILITY_MS")? {
        groups.max_visibility = Duration::from_millis(ms);
    }
    if let Some(ms) = positive("FELIX_GROUP_MAX_WAIT_MS")? {
        groups.max_wait = Duration::from_millis(ms);
    }
    if let Some(n) = positive("FELIX_GROUP_MAX_IN_FLIGHT")? {
        groups.max_in_flight = n as usize;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(vars: &[(&str, &str)]) -> Result<GroupConfig, ConfigError> {
        let number = |name: &str| -> Result<Option<u64>, ConfigError> {
            vars.iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| v.parse().map_err(|_| ConfigError(format!("{name} bad"))))
                .transpose()
        };
        let mut g = GroupConfig::default();
        groups_from_vars(&number, &mut g)?;
        Ok(g)
    }

    #[test]
    fn group_variables_set_the_limits_and_zero_is_refused() {
        assert_eq!(read(&[]).unwrap(), GroupConfig::default());
        let g = read(&[
            ("FELIX_GROUP_MAX_ATTEMPTS", "3"),
            ("FELIX_GROUP_VISIBILITY_TIMEOUT_MS", "1500"),
            ("FELIX_GROUP_MAX_WAIT_MS", "2000"),
            ("FELIX_GROUP_MAX_IN_FLIGHT", "64"),
        ])
        .unwrap();
        assert_eq!(g.max_attempts, 3);
        assert_eq!(g.visibility_timeout, Duration::from_millis(1500));
        assert_eq!(g.max_wait, Duration::from_secs(2));
        assert_eq!(g.max_in_flight, 64);
        let e = read(&[("FELIX_GROUP_MAX_ATTEMPTS", "0")]).unwrap_err();
        assert!(e.0.contains("FELIX_GROUP_MAX_ATTEMPTS"), "{e}");
    }
}
