//! `run_world`: a program run on every device of a new loopback world, one
//! thread each.
//!
//! Invariants: a device whose program fails or panics aborts its
//! communicator, so the others get an error naming it instead of waiting
//! for the timeout; every device's outcome is returned, in device order;
//! nothing here panics (panics are caught and reported as outcomes).

use super::sync::lock;
use super::world::{LoopbackCommunicator, LoopbackWorld};
use crate::error::Result;
use crate::groups::DeviceId;
use std::sync::Mutex;
use std::time::Duration;

/// What one device of [`run_world`] ended with.
#[derive(Debug)]
pub enum DeviceOutcome<T, E> {
    Done(T),
    Failed(E),
    /// The device's thread panicked or could not start (the message).
    Panicked(String),
}

/// Runs `program` on every device of a new loopback world of `num_devices`
/// devices, one thread each. A device whose program fails or panics aborts
/// its communicator, so the others get an error naming it instead of
/// waiting for `timeout`. Returns each device's outcome, in device order.
pub fn run_world<T, E, F>(
    num_devices: usize,
    timeout: Duration,
    program: F,
) -> Result<Vec<DeviceOutcome<T, E>>>
where
    T: Send,
    E: Send + std::fmt::Display,
    F: Fn(DeviceId, &Mutex<LoopbackCommunicator>) -> std::result::Result<T, E> + Sync,
{
    let world = LoopbackWorld::new(num_devices, timeout)?;
    let cells: Vec<Mutex<LoopbackCommunicator>> =
        world.communicators()?.into_iter().map(Mutex::new).collect();
    let program = &program;
    let run_one = |device: DeviceId, cell: &Mutex<LoopbackCommunicator>| {
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| program(device, cell)));
        let outcome = match r {
            Ok(Ok(v)) => return DeviceOutcome::Done(v),
            Ok(Err(e)) => {
                lock(cell).abort(&format!("device {device} failed: {e}"));
                return DeviceOutcome::Failed(e);
            }
            Err(payload) => payload
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| payload.downcast_ref::<String>().cloned())
                .unwrap_or_default(),
        };
        lock(cell).abort(&format!("device {device} panicked: {outcome}"));
        DeviceOutcome::Panicked(outcome)
    };
    let run_one = &run_one;
    Ok(std::thread::scope(|s| {
        let handles: Vec<_> = cells
            .iter()
            .enumerate()
            .map(|(device, cell)| {
                std::thread::Builder::new()
                    .name(format!("loopback-device-{device}"))
                    .spawn_scoped(s, move || run_one(device, cell))
            })
            .collect();
        handles
            .into_iter()
            .enumerate()
            .map(|(device, handle)| {
                let why = match handle.map(|h| h.join()) {
                    Ok(Ok(outcome)) => return outcome,
                    Ok(Err(_)) => "its thread died".to_string(),
                    Err(e) => format!("could not start its thread: {e}"),
                };
                lock(&cells[device]).abort(&format!("device {device}: {why}"));
                DeviceOutcome::Panicked(why)
            })
            .collect()
    }))
}
