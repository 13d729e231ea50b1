//! Resource overrides of a task (`--gpus`, `--infra`, ... on the command
//! line): plain data that can be stored with a managed job and applied
//! again on every recovery, by whoever loads the task.

use serde::{Deserialize, Serialize};

use super::{Choice, ResourceSpec, SpecError, Task};

/// What the command line changes in a task's resources. The field names
/// are the flags'; the texts are parsed when applied, so a stored value is
/// checked the same way as a typed one.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub(crate) struct Overrides {
    /// `--infra`: cloud[/region[/zone]].
    #[serde(default)]
    pub(crate) infra: Option<String>,
    /// `--gpus`, e.g. `A100:8` (replaces the accelerators and any type).
    #[serde(default)]
    pub(crate) gpus: Option<String>,
    /// `--cpus`, e.g. `8+`.
    #[serde(default)]
    pub(crate) cpus: Option<String>,
    /// `--memory` in GiB, e.g. `64+`.
    #[serde(default)]
    pub(crate) memory: Option<String>,
    /// `--instance-type`.
    #[serde(default)]
    pub(crate) instance_type: Option<String>,
    /// `--num-nodes`.
    #[serde(default)]
    pub(crate) num_nodes: Option<u32>,
    /// `--use-spot`.
    #[serde(default)]
    pub(crate) use_spot: bool,
}

/// A flag's value that is not valid for the field it overrides.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{flag} '{text}': {message}")]
pub(crate) struct OverrideError {
    /// The flag, `--gpus`.
    pub(crate) flag: &'static str,
    /// Its value.
    pub(crate) text: String,
    /// What is wrong.
    pub(crate) message: String,
    /// What to do about it.
    pub(crate) hint: Option<String>,
}

impl Overrides {
    /// Checks every flag's value without a task (a wrong flag is reported
    /// before the file is read).
    pub(crate) fn check(&self) -> Result<(), OverrideError> {
        self.parsed().map(|_| ())
    }

    fn parsed(&self) -> Result<[Option<ResourceSpec>; 4], OverrideError> {
        let parse = |flag: &'static str, v: &Option<String>| {
            v.as_ref()
                .map(|t| {
                    super::parse_flag(flag, t).map_err(|e: SpecError| OverrideError {
                        flag,
                        text: t.clone(),
                        message: e.message,
                        hint: e.hint,
                    })
                })
                .transpose()
        };
        Ok([
            parse("--infra", &self.infra)?,
            parse("--gpus", &self.gpus)?,
            parse("--cpus", &self.cpus)?,
            parse("--memory", &self.memory)?,
        ])
    }

    /// Applies every override to `task` (each alternative of an `any_of`
    /// or `ordered` list too).
    pub(crate) fn apply(&self, task: &mut Task) -> Result<(), OverrideError> {
        let [infra, gpus, cpus, memory] = self.parsed()?;
        if let Some(n) = self.num_nodes {
            task.num_nodes = n;
        }
        if let Some(s) = infra {
            task.for_each_resources(|r| r.infra = s.infra.clone());
        }
        if let Some(s) = gpus {
            task.for_each_resources(|r| {
                r.accelerators = s.accelerators.clone();
                r.instance_type = None;
            });
        }
        if let Some(s) = cpus {
            task.for_each_resources(|r| r.cpus = s.cpus);
        }
        if let Some(s) = memory {
            task.for_each_resources(|r| r.memory = s.memory);
        }
        if let Some(t) = &self.instance_type {
            task.for_each_resources(|r| r.instance_type = Some(t.clone()));
        }
        if self.use_spot {
            task.set_market(true);
        }
        Ok(())
    }
}

impl Task {
    /// Runs `f` on the base resources and on every alternative.
    pub(crate) fn for_each_resources(&mut self, f: impl Fn(&mut ResourceSpec)) {
        f(&mut self.resources.base);
        if let Choice::AnyOf(items) | Choice::Ordered(items) = &mut self.resources.choice {
            items.iter_mut().for_each(f);
        }
    }

    /// Pins every alternative to one market: spot or on-demand.
    pub(crate) fn set_market(&mut self, spot: bool) {
        self.for_each_resources(|r| r.use_spot = Some(spot));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn task(text: &str) -> Task {
        super::super::parse_str(text, "t.yaml").unwrap()
    }

    #[test]
    fn overrides_reach_every_alternative_and_survive_a_round_trip() {
        let o = Overrides {
            gpus: Some("H100:8".into()),
            num_nodes: Some(4),
            use_spot: true,
            ..Overrides::default()
        };
        let stored = serde_json::to_string(&o).unwrap();
        let back: Overrides = serde_json::from_str(&stored).unwrap();
        assert_eq!(back, o);
        let mut t = task(
            "resources:\n  any_of:\n    - {accelerators: A100:8}\n    - {instance_type: p4d.24xlarge}\nrun: x\n",
        );
        back.apply(&mut t).unwrap();
        assert_eq!(t.num_nodes, 4);
        let Choice::AnyOf(items) = &t.resources.choice else {
            panic!("any_of kept")
        };
        for r in items.iter().chain([&t.resources.base]) {
            assert_eq!(r.use_spot, Some(true));
            assert_eq!(r.instance_type, None, "--gpus drops the instance type");
            assert_eq!(
                r.accelerators,
                Some(crate::core::spec::Accelerators::One(
                    crate::core::spec::Accel {
                        name: "H100".into(),
                        count: 8.0
                    }
                ))
            );
        }
    }

    #[test]
    fn a_bad_flag_names_the_flag_and_its_value() {
        let o = Overrides {
            cpus: Some("many".into()),
            ..Overrides::default()
        };
        let e = o.check().unwrap_err();
        assert_eq!(e.flag, "--cpus");
        assert!(e.to_string().starts_with("--cpus 'many': "), "{e}");
    }
}
