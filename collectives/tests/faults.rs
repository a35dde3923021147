//! Fault tests of the loopback backend: a rank that never arrives,
//! mismatched calls between ranks, and a rank that fails mid-way each give
//! a clear error on every rank within the timeout (no hang, no panic).

use collectives::{
    CollectiveError, Communicator, DeviceBuffer, InjectedFault, LoopbackCommunicator,
    LoopbackWorld, ReductionKind,
};
use std::sync::Barrier;
use std::time::{Duration, Instant};
use xla_hlo_ir::PrimitiveType;

// Long enough that thread start-up on a loaded 2-core machine never looks
// like a missing rank; the stall and late-rank tests wait a few of these.
const TIMEOUT: Duration = Duration::from_millis(1000);

fn f32s(v: &[f32]) -> DeviceBuffer {
    DeviceBuffer::from_slice(vec![v.len() as i64], v).unwrap()
}

/// Runs `f` for every device on its own thread; a panicking thread yields
/// `None`. Returns results and each thread's elapsed time.
fn run<T: Send>(
    n: usize,
    timeout: Duration,
    f: impl Fn(usize, &mut LoopbackCommunicator) -> T + Sync,
) -> Vec<(Option<T>, Duration)> {
    let world = LoopbackWorld::new(n, timeout).unwrap();
    let comms = world.communicators().unwrap();
    std::thread::scope(|s| {
        let hs: Vec<_> = comms
            .into_iter()
            .enumerate()
            .map(|(d, mut c)| {
                let f = &f;
                s.spawn(move || {
                    let t = Instant::now();
                    let r = f(d, &mut c);
                    (r, t.elapsed())
                })
            })
            .collect();
        hs.into_iter()
            .map(|h| match h.join() {
                Ok((r, t)) => (Some(r), t),
                Err(_) => (None, Duration::ZERO),
            })
            .collect()
    })
}

fn all(n: usize) -> Vec<usize> {
    (0..n).collect()
}

#[test]
fn rank_that_never_arrives_times_out_everywhere() {
    let n = 4;
    let release = Barrier::new(n);
    let results = run(n, TIMEOUT, |d, c| {
        let r = if d == 3 {
            None // device 3 never calls the all-reduce
        } else {
            Some(c.all_reduce(&all(n), ReductionKind::Sum, &[f32s(&[1.0])]))
        };
        // Keep device 3's communicator alive until everyone is done, so the
        // error is the timeout, not "dropped".
        release.wait();
        r
    });
    for (d, (r, elapsed)) in results.into_iter().enumerate().take(3) {
        let err = r.unwrap().unwrap().unwrap_err();
        match &err {
            CollectiveError::Timeout {
                call,
                missing,
                missing_ranks,
                stage,
                ..
            } => {
                assert_eq!(missing, &vec![3]);
                assert_eq!(missing_ranks, &vec![3]);
                assert_eq!(*stage, "arrive");
                assert_eq!(call.group, all(n));
            }
            e => panic!("device {d}: unexpected error {e}"),
        }
        let msg = err.to_string();
        assert!(msg.contains("all-reduce") && msg.contains("[3]"), "{msg}");
        assert!(elapsed < TIMEOUT * 3, "device {d} took {elapsed:?}");
    }
}

#[test]
fn late_rank_finds_the_failure() {
    let n = 3;
    let results = run(n, TIMEOUT, |d, c| {
        if d == 2 {
            std::thread::sleep(TIMEOUT * 2);
        }
        c.all_gather(&all(n), 0, &[f32s(&[d as f32])])
    });
    for (r, _) in results {
        let err = r.unwrap().unwrap_err();
        assert!(
            matches!(&err, CollectiveError::Timeout { missing, .. } if missing == &vec![2]),
            "{err}"
        );
    }
}

#[test]
fn mismatched_shapes_fail_on_every_rank() {
    let n = 4;
    let results = run(n, Duration::from_secs(30), |d, c| {
        let x = if d == 1 {
            f32s(&[1.0, 2.0, 3.0])
        } else {
            f32s(&[1.0, 2.0, 3.0, 4.0])
        };
        c.all_reduce(&all(n), ReductionKind::Sum, &[x])
    });
    for (d, (r, elapsed)) in results.into_iter().enumerate() {
        let err = r.unwrap().unwrap_err();
        let CollectiveError::Mismatch { detail, .. } = &err else {
            panic!("device {d}: {err}")
        };
        assert!(
            detail.contains("f32[3]") && detail.contains("f32[4]"),
            "{detail}"
        );
        // Mismatches are reported at once, not after the timeout.
        assert!(elapsed < Duration::from_secs(10), "{elapsed:?}");
    }
}

#[test]
fn mismatched_dtypes_kinds_and_parameters_fail() {
    let n = 3;
    // dtype
    let results = run(n, Duration::from_secs(30), |d, c| {
        let x = if d == 0 {
            DeviceBuffer::from_slice(vec![2], &[1i32, 2]).unwrap()
        } else {
            f32s(&[1.0, 2.0])
        };
        c.all_gather(&all(n), 0, &[x])
    });
    for (r, _) in results {
        assert!(matches!(r.unwrap(), Err(CollectiveError::Mismatch { .. })));
    }
    // collective kind
    let results = run(n, Duration::from_secs(30), |d, c| {
        let x = f32s(&[1.0, 2.0, 3.0]);
        if d == 2 {
            c.all_gather(&all(n), 0, &[x])
        } else {
            c.all_reduce(&all(n), ReductionKind::Sum, &[x])
        }
    });
    for (r, _) in results {
        let err = r.unwrap().unwrap_err();
        assert!(
            matches!(&err, CollectiveError::Mismatch { detail, .. } if detail.contains("all-gather") && detail.contains("all-reduce")),
            "{err}"
        );
    }
    // reduction kind
    let results = run(n, Duration::from_secs(30), |d, c| {
        let kind = if d == 0 {
            ReductionKind::Max
        } else {
            ReductionKind::Sum
        };
        c.all_reduce(&all(n), kind, &[f32s(&[1.0])])
    });
    for (r, _) in results {
        let err = r.unwrap().unwrap_err();
        assert!(err.to_string().contains("maximum"), "{err}");
    }
    // operand count
    let results = run(n, Duration::from_secs(30), |d, c| {
        let ops: Vec<DeviceBuffer> = (0..=d.min(1)).map(|_| f32s(&[1.0])).collect();
        c.collective_broadcast(&all(n), &ops)
    });
    for (r, _) in results {
        assert!(matches!(r.unwrap(), Err(CollectiveError::Mismatch { .. })));
    }
}

#[test]
fn invalid_parameters_fail_on_every_rank() {
    let n = 4;
    // dims[0] = 6 is not divisible by 4
    let results = run(n, Duration::from_secs(30), |_, c| {
        c.reduce_scatter(
            &all(n),
            ReductionKind::Sum,
            0,
            &[f32s(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0])],
        )
    });
    for (r, _) in results {
        let err = r.unwrap().unwrap_err();
        assert!(err.to_string().contains("not divisible"), "{err}");
    }
    // and/or on floats
    let results = run(2, Duration::from_secs(30), |_, c| {
        c.all_reduce(&[0, 1], ReductionKind::And, &[f32s(&[1.0])])
    });
    for (r, _) in results {
        assert!(matches!(r.unwrap(), Err(CollectiveError::Unsupported(_))));
    }
    // a group that does not contain the caller, or repeats a device
    let world = LoopbackWorld::new(3, TIMEOUT).unwrap();
    let mut c = world.communicator(0).unwrap();
    assert!(matches!(
        c.barrier(&[1, 2]),
        Err(CollectiveError::InvalidGroups(_))
    ));
    assert!(matches!(
        c.barrier(&[0, 0]),
        Err(CollectiveError::InvalidGroups(_))
    ));
    assert!(matches!(
        c.barrier(&[0, 5]),
        Err(CollectiveError::InvalidGroups(_))
    ));
    assert!(world.communicator(0).is_err(), "claimed twice");
    assert!(world.communicator(3).is_err(), "out of range");
}

#[test]
fn rank_that_panics_midway_fails_every_rank_fast() {
    let n = 4;
    let long = Duration::from_secs(30);
    let results = run(n, long, |d, c| {
        let g = all(n);
        // Two good rounds.
        for round in 0..2 {
            let r = c
                .all_reduce(&g, ReductionKind::Sum, &[f32s(&[d as f32; 1000])])
                .unwrap();
            assert_eq!(r[0].typed::<f32>().unwrap()[0], 6.0, "round {round}");
        }
        if d == 2 {
            c.inject_fault(InjectedFault::PanicMidway);
        }
        let t = Instant::now();
        let r = c.all_reduce(&g, ReductionKind::Sum, &[f32s(&[1.0; 1000])]);
        (r, t.elapsed())
    });
    for (d, (r, _)) in results.into_iter().enumerate() {
        if d == 2 {
            assert!(r.is_none(), "device 2 panicked");
            continue;
        }
        let (r, elapsed) = r.unwrap();
        let err = r.unwrap_err();
        match &err {
            CollectiveError::PeerFailed { device, call, .. } => {
                assert_eq!(*device, 2);
                assert_eq!(call.sequence, 2);
            }
            e => panic!("device {d}: {e}"),
        }
        assert!(elapsed < long / 4, "failure took {elapsed:?}");
    }
}

#[test]
fn rank_that_stalls_midway_times_out_at_finish() {
    let n = 3;
    let results = run(n, TIMEOUT, |d, c| {
        if d == 1 {
            c.inject_fault(InjectedFault::StallMidway(TIMEOUT * 3));
        }
        c.all_reduce(&all(n), ReductionKind::Sum, &[f32s(&[1.0; 64])])
    });
    for (d, (r, elapsed)) in results.into_iter().enumerate() {
        let err = r.unwrap().unwrap_err();
        match &err {
            CollectiveError::Timeout { missing, stage, .. } => {
                assert_eq!(missing, &vec![1], "device {d}");
                assert_eq!(*stage, "finish");
            }
            e => panic!("device {d}: {e}"),
        }
        if d != 1 {
            assert!(elapsed < TIMEOUT * 3, "device {d} took {elapsed:?}");
        }
    }
}

#[test]
fn aborted_or_dropped_rank_fails_later_collectives() {
    let n = 3;
    let long = Duration::from_secs(30);
    let results = run(n, long, |d, c| {
        c.barrier(&all(n)).unwrap();
        if d == 0 {
            c.abort("simulated device loss");
            return None;
        }
        let t = Instant::now();
        let r = c.all_gather(&all(n), 0, &[f32s(&[1.0])]);
        // A group without device 0 still works.
        let ok = c.all_reduce(&[1, 2], ReductionKind::Sum, &[f32s(&[1.0])]);
        Some((r, t.elapsed(), ok))
    });
    for (d, (r, _)) in results.into_iter().enumerate().skip(1) {
        let (r, elapsed, ok) = r.unwrap().unwrap();
        let err = r.unwrap_err();
        assert!(
            matches!(&err, CollectiveError::PeerFailed { device: 0, reason, .. } if reason.contains("simulated")),
            "device {d}: {err}"
        );
        assert!(elapsed < long / 4);
        assert_eq!(ok.unwrap()[0].typed::<f32>().unwrap(), &[2.0]);
    }
    // Dropping a communicator has the same effect.
    let world = LoopbackWorld::new(2, long).unwrap();
    let mut a = world.communicator(0).unwrap();
    drop(world.communicator(1).unwrap());
    let err = a.barrier(&[0, 1]).unwrap_err();
    assert!(err.to_string().contains("dropped"), "{err}");
}

#[test]
fn recv_errors() {
    // Keeps both communicators alive until both are done.
    let done = Barrier::new(2);
    let results = run(2, TIMEOUT, |d, c| {
        if d == 0 {
            // Never sends on tag 1; sends the wrong shape on tag 2.
            c.send(1, 2, &f32s(&[1.0, 2.0])).unwrap();
            done.wait();
            None
        } else {
            let timeout = c.recv(0, 1, PrimitiveType::F32, &[2]);
            let wrong = c.recv(0, 2, PrimitiveType::F32, &[3]);
            done.wait();
            Some((timeout, wrong))
        }
    });
    let (timeout, wrong) = results[1].0.as_ref().unwrap().as_ref().unwrap();
    let err = timeout.as_ref().unwrap_err();
    assert!(
        matches!(err, CollectiveError::Timeout { missing, .. } if missing == &vec![0]),
        "{err}"
    );
    let err = wrong.as_ref().unwrap_err();
    assert!(
        matches!(err, CollectiveError::Mismatch { detail, .. } if detail.contains("f32[2]") && detail.contains("f32[3]")),
        "{err}"
    );
    // wait_sends names the peer that never received.
    let world = LoopbackWorld::new(2, TIMEOUT).unwrap();
    let mut a = world.communicator(0).unwrap();
    let _b = world.communicator(1).unwrap();
    a.send(1, 0, &f32s(&[1.0])).unwrap();
    let err = a.wait_sends().unwrap_err();
    assert!(
        matches!(&err, CollectiveError::Timeout { missing, .. } if missing == &vec![1]),
        "{err}"
    );
}

#[test]
fn world_keeps_working_after_a_failed_call() {
    let n = 2;
    let results = run(n, TIMEOUT, |d, c| {
        // Call 0 fails (shape mismatch); call 1 on the same group works.
        let x = if d == 0 {
            f32s(&[1.0])
        } else {
            f32s(&[1.0, 2.0])
        };
        let first = c.all_reduce(&all(n), ReductionKind::Sum, &[x]);
        let second = c.all_reduce(&all(n), ReductionKind::Sum, &[f32s(&[3.0])]);
        (
            first.is_err(),
            second.unwrap()[0].typed::<f32>().unwrap().to_vec(),
        )
    });
    for (r, _) in results {
        let (first_failed, second) = r.unwrap();
        assert!(first_failed);
        assert_eq!(second, vec![6.0]);
    }
}

/// `run_world`: a device whose program fails or panics before a collective
/// makes the others fail with an error naming it, long before the timeout;
/// each device's outcome is reported.
#[test]
fn run_world_propagates_failures_and_panics() {
    use collectives::{run_world, DeviceOutcome};
    let long = Duration::from_secs(30);
    for panics in [false, true] {
        let t = Instant::now();
        let outcomes = run_world(4, long, |d, comm| -> Result<f32, String> {
            if d == 2 {
                if panics {
                    panic!("device program bug");
                }
                return Err("device program error".into());
            }
            let mut c = comm.lock().unwrap();
            let out = c
                .all_reduce(&all(4), ReductionKind::Sum, &[f32s(&[1.0])])
                .map_err(|e| e.to_string())?;
            Ok(out[0].typed::<f32>().unwrap()[0])
        })
        .unwrap();
        assert!(t.elapsed() < Duration::from_secs(10), "{:?}", t.elapsed());
        for (d, o) in outcomes.iter().enumerate() {
            match (d, o) {
                (2, DeviceOutcome::Panicked(m)) if panics => assert!(m.contains("bug"), "{m}"),
                (2, DeviceOutcome::Failed(m)) if !panics => assert!(m.contains("error"), "{m}"),
                (_, DeviceOutcome::Failed(m)) if d != 2 => {
                    assert!(m.contains("device 2"), "device {d}: {m}")
                }
                other => panic!("unexpected outcome {other:?} (panics={panics})"),
            }
        }
    }
    // Without failures every device finishes.
    let outcomes = run_world(3, long, |d, comm| -> Result<usize, String> {
        comm.lock()
            .unwrap()
            .barrier(&all(3))
            .map_err(|e| e.to_string())?;
        Ok(d)
    })
    .unwrap();
    assert!(outcomes
        .iter()
        .enumerate()
        .all(|(d, o)| matches!(o, DeviceOutcome::Done(x) if *x == d)));
}
