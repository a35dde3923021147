//! A tactic schedule as the user writes it (JSON): a named mesh and an
//! ordered list of tactics. A tactic shards named values on one mesh axis:
//!
//! - `{"name": "...", "axis": "y", "shard": [{"value": "w1", "dim": 1}]}`:
//!   explicit values and dimensions;
//! - `{"recipe": "batch", "axis": "x", "values": ["x", "y"]}`: data
//!   parallelism, dimension 0 of each value (`"dim"` to change it);
//! - `{"recipe": "megatron", "axis": "y", "column": ["w1"], "row": ["w2"]}`:
//!   column-parallel weights split on their last dimension, row-parallel
//!   ones on their first;
//! - `{"recipe": "zero3", "axis": "x", "values": ["w*"]}` (or `"fsdp"`):
//!   each value split on its largest dimension that no earlier tactic
//!   shards.
//!
//! A `shard` entry names its values by `"value"` (entry parameters whose
//! name, without its `.N` suffix, or `op_name` matches), `"op_name"`
//! (intermediate values of the entry computation whose `op_name` matches,
//! e.g. a `jax.named_scope`) or `"output"` (an element of the result);
//! recipes name parameters. In patterns `*` matches any run of characters.
//!
//! Invariant: parsing never panics; every error names the tactic (by
//! position and name) and the field that is wrong.

use serde_json::Value;

/// One value a tactic shards, and on which dimension.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DimChoice {
    /// This dimension.
    Dim(usize),
    /// The last dimension.
    Last,
    /// The largest dimension no earlier tactic shards (ZeRO-3 / FSDP).
    LargestFree,
}

/// What a tactic shards.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Selector {
    /// Entry parameters whose name (or `op_name`) matches the pattern.
    Parameter(String),
    /// Entry-computation instructions (not parameters) whose `op_name`
    /// matches the pattern: intermediate values, constrained in place as
    /// JAX's `with_sharding_constraint` does.
    OpName(String),
    /// Element `k` of the entry's result.
    Output(usize),
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Target {
    pub selector: Selector,
    pub dim: DimChoice,
}

impl Target {
    pub fn parameter(pattern: impl Into<String>, dim: DimChoice) -> Target {
        Target {
            selector: Selector::Parameter(pattern.into()),
            dim,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Tactic {
    pub name: String,
    pub axis: String,
    pub targets: Vec<Target>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Schedule {
    pub mesh: Vec<(String, i64)>,
    pub tactics: Vec<Tactic>,
}

fn strings(value: Option<&Value>, what: &str) -> Result<Vec<String>, String> {
    match value {
        None => Ok(Vec::new()),
        Some(Value::String(s)) => Ok(vec![s.clone()]),
        Some(Value::Array(items)) => items
            .iter()
            .map(|item| {
                item.as_str()
                    .map(str::to_string)
                    .ok_or_else(|| format!("`{what}` must list strings, found {item}"))
            })
            .collect(),
        Some(other) => Err(format!(
            "`{what}` must be a string or a list of strings, found {other}"
        )),
    }
}

fn tactic(index: usize, value: &Value) -> Result<Tactic, String> {
    let object = value
        .as_object()
        .ok_or_else(|| format!("tactic {index}: expected an object, found {value}"))?;
    let recipe = object.get("recipe").and_then(Value::as_str);
    let name = object
        .get("name")
        .and_then(Value::as_str)
        .map(str::to_string)
        .unwrap_or_else(|| format!("{}{index}", recipe.unwrap_or("tactic")));
    let context = |message: String| format!("tactic {index} ({name}): {message}");
    let axis = object
        .get("axis")
        .and_then(Value::as_str)
        .ok_or_else(|| context("needs an `axis` (a mesh axis name)".into()))?
        .to_string();
    let dim_of = |v: Option<&Value>, default: DimChoice| -> Result<DimChoice, String> {
        match v {
            None => Ok(default),
            Some(Value::String(s)) if s == "last" => Ok(DimChoice::Last),
            Some(Value::String(s)) if s == "largest" => Ok(DimChoice::LargestFree),
            Some(d) => d
                .as_u64()
                .map(|d| DimChoice::Dim(d as usize))
                .ok_or_else(|| {
                    context(format!(
                        "`dim` must be a dimension number, \"last\" or \"largest\", found {d}"
                    ))
                }),
        }
    };
    let targets = match recipe {
        None => {
            let shard = object
                .get("shard")
                .and_then(Value::as_array)
                .ok_or_else(|| context("needs a `recipe` or a `shard` list".into()))?;
            shard
                .iter()
                .map(|entry| {
                    let dim = dim_of(entry.get("dim"), DimChoice::Dim(0))?;
                    let selector = if let Some(pattern) = entry.get("value").and_then(Value::as_str)
                    {
                        Selector::Parameter(pattern.to_string())
                    } else if let Some(pattern) = entry.get("op_name").and_then(Value::as_str) {
                        Selector::OpName(pattern.to_string())
                    } else if let Some(k) = entry.get("output").and_then(Value::as_u64) {
                        Selector::Output(k as usize)
                    } else {
                        return Err(context(format!(
                            "a `shard` entry needs a `value`, an `op_name` or an `output`: {entry}"
                        )));
                    };
                    Ok(Target { selector, dim })
                })
                .collect::<Result<Vec<_>, String>>()?
        }
        Some("batch") | Some("data") => {
            let dim = dim_of(object.get("dim"), DimChoice::Dim(0))?;
            strings(object.get("values"), "values")
                .map_err(context)?
                .into_iter()
                .map(|pattern| Target::parameter(pattern, dim.clone()))
                .collect()
        }
        Some("megatron") => {
            let column = strings(object.get("column"), "column").map_err(context)?;
            let row = strings(object.get("row"), "row").map_err(context)?;
            if column.is_empty() && row.is_empty() {
                return Err(context(
                    "megatron needs `column` and/or `row` weights".into(),
                ));
            }
            column
                .into_iter()
                .map(|pattern| Target::parameter(pattern, DimChoice::Last))
                .chain(
                    row.into_iter()
                        .map(|pattern| Target::parameter(pattern, DimChoice::Dim(0))),
                )
                .collect()
        }
        Some("zero3") | Some("fsdp") => strings(object.get("values"), "values")
            .map_err(context)?
            .into_iter()
            .map(|pattern| Target::parameter(pattern, DimChoice::LargestFree))
            .collect(),
        Some(other) => {
            return Err(context(format!(
                "unknown recipe {other:?}: expected batch, megatron, zero3 or fsdp"
            )))
        }
    };
    if targets.is_empty() {
        return Err(context("names no value".into()));
    }
    Ok(Tactic {
        name,
        axis,
        targets,
    })
}

/// Parses a schedule: `{"mesh": {"x": 2, "y": 4}, "tactics": [...]}` (the
/// mesh as an object in axis order, or as `[["x", 2], ["y", 4]]`).
pub fn parse_schedule(text: &str) -> Result<Schedule, String> {
    let value: Value = serde_json::from_str(text).map_err(|e| format!("not JSON: {e}"))?;
    let mesh: Vec<(String, i64)> = match value.get("mesh") {
        Some(Value::Object(axes)) => axes
            .iter()
            .map(|(name, size)| {
                size.as_i64()
                    .filter(|&s| s > 0)
                    .map(|s| (name.clone(), s))
                    .ok_or_else(|| format!("mesh axis {name:?}: size must be a positive integer"))
            })
            .collect::<Result<_, _>>()?,
        Some(Value::Array(axes)) => axes
            .iter()
            .map(|axis| match axis.as_array().map(Vec::as_slice) {
                Some([Value::String(name), size]) => size
                    .as_i64()
                    .filter(|&s| s > 0)
                    .map(|s| (name.clone(), s))
                    .ok_or_else(|| format!("mesh axis {name:?}: size must be a positive integer")),
                _ => Err(format!(
                    "mesh axes must be [name, size] pairs, found {axis}"
                )),
            })
            .collect::<Result<_, _>>()?,
        _ => return Err("needs a `mesh`, e.g. {\"x\": 2, \"y\": 4}".into()),
    };
    if mesh.is_empty() {
        return Err("the mesh has no axis".into());
    }
    let tactics = value
        .get("tactics")
        .and_then(Value::as_array)
        .ok_or("needs a `tactics` list")?
        .iter()
        .enumerate()
        .map(|(i, t)| tactic(i, t))
        .collect::<Result<Vec<_>, _>>()?;
    for t in &tactics {
        if !mesh.iter().any(|(name, _)| *name == t.axis) {
            return Err(format!(
                "tactic {}: axis {:?} is not in the mesh ({})",
                t.name,
                t.axis,
                mesh.iter()
                    .map(|(n, s)| format!("{n}={s}"))
                    .collect::<Vec<_>>()
                    .join(",")
            ));
        }
    }
    Ok(Schedule { mesh, tactics })
}

/// `*`-glob match.
pub fn glob_match(pattern: &str, text: &str) -> bool {
    match pattern.split_once('*') {
        None => pattern == text,
        Some((prefix, rest)) => {
            if !text.starts_with(prefix) {
                return false;
            }
            let tail = &text[prefix.len()..];
            (0..=tail.len()).any(|k| tail.is_char_boundary(k) && glob_match(rest, &tail[k..]))
        }
    }
}

/// The schedule as JSON that [`parse_schedule`] reads back (explicit
/// `shard` lists).
pub fn schedule_to_json(schedule: &Schedule) -> Value {
    let mesh: serde_json::Map<String, Value> = schedule
        .mesh
        .iter()
        .map(|(name, size)| (name.clone(), Value::from(*size)))
        .collect();
    let tactics: Vec<Value> = schedule
        .tactics
        .iter()
        .map(|t| {
            let shard: Vec<Value> = t
                .targets
                .iter()
                .map(|target| {
                    let dim = match target.dim {
                        DimChoice::Dim(d) => Value::from(d),
                        DimChoice::Last => Value::from("last"),
                        DimChoice::LargestFree => Value::from("largest"),
                    };
                    match &target.selector {
                        Selector::Parameter(p) => serde_json::json!({"value": p, "dim": dim}),
                        Selector::OpName(p) => serde_json::json!({"op_name": p, "dim": dim}),
                        Selector::Output(k) => serde_json::json!({"output": k, "dim": dim}),
                    }
                })
                .collect();
            serde_json::json!({"name": t.name, "axis": t.axis, "shard": shard})
        })
        .collect();
    serde_json::json!({"mesh": mesh, "tactics": tactics})
}
