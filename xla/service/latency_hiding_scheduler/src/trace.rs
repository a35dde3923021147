//! Chrome / Perfetto trace JSON of a simulated timeline (the "JSON Array
//! Format" with a `traceEvents` list, loadable in chrome://tracing and
//! ui.perfetto.dev).
//!
//! One process per timeline (the entry first, then one execution of each
//! loop body, branch or callee that moves data). Tracks: thread 0 is the
//! compute stream (instructions, and "wait ..." slices where it blocks on
//! a transfer); one thread per resource lane (all-gather, all-reduce, ...)
//! holds the transfers; a counter track "live bytes" shows memory. Times
//! are microseconds, as the format wants.
//!
//! Invariant: the output is one valid JSON object whatever the names hold
//! (serde_json escapes them).

use crate::simulator::Timeline;
use serde_json::{json, Value};

/// The trace of `timelines` as a JSON value.
pub fn chrome_trace(timelines: &[Timeline], module_name: &str) -> Value {
    let mut events: Vec<Value> = Vec::new();
    for (pid, timeline) in timelines.iter().enumerate() {
        push_timeline(&mut events, pid, timeline, module_name);
    }
    json!({"traceEvents": events, "displayTimeUnit": "ms"})
}

fn push_timeline(events: &mut Vec<Value>, pid: usize, timeline: &Timeline, module_name: &str) {
    events.push(
        json!({"name": "process_name", "ph": "M", "pid": pid, "tid": 0,
        "args": {"name": format!("{module_name} / {}", timeline.computation)}}),
    );
    events.push(
        json!({"name": "process_sort_index", "ph": "M", "pid": pid, "tid": 0,
        "args": {"sort_index": pid}}),
    );
    events.push(
        json!({"name": "thread_name", "ph": "M", "pid": pid, "tid": 0,
        "args": {"name": "compute stream"}}),
    );
    events.push(
        json!({"name": "thread_sort_index", "ph": "M", "pid": pid, "tid": 0,
        "args": {"sort_index": 0}}),
    );
    for (tid, label) in &timeline.lanes {
        events.push(
            json!({"name": "thread_name", "ph": "M", "pid": pid, "tid": tid,
            "args": {"name": label}}),
        );
        events.push(
            json!({"name": "thread_sort_index", "ph": "M", "pid": pid, "tid": tid,
            "args": {"sort_index": tid}}),
        );
    }
    for e in &timeline.events {
        let mut args = serde_json::Map::new();
        for (k, v) in &e.args {
            args.insert((*k).to_string(), v.clone());
        }
        events.push(json!({
            "name": e.name,
            "cat": e.category,
            "ph": "X",
            "pid": pid,
            "tid": e.tid,
            "ts": e.ts_us,
            "dur": e.dur_us,
            "args": Value::Object(args),
        }));
    }
    for &(ts, bytes) in &timeline.memory {
        events.push(
            json!({"name": "live bytes", "ph": "C", "pid": pid, "tid": 0, "ts": ts,
            "args": {"bytes": bytes}}),
        );
    }
}
