//! Helpers shared by the integration tests: deterministic random buffers of
//! every element type, random group layouts, running one closure per device
//! on its own thread, and NaN-aware buffer comparison.
#![allow(dead_code)]

use collectives::buffer::{element_count, element_size};
use collectives::{DeviceBuffer, DeviceId, HostBytes, LoopbackCommunicator, LoopbackWorld};
use half::{bf16, f16};
use std::time::Duration;
use xla_hlo_ir::{PrimitiveType, TypeClass};

/// Element types the tests draw from (every type with data that the
/// reductions support, sub-byte and f8 included).
pub const DTYPES: &[PrimitiveType] = &[
    PrimitiveType::Pred,
    PrimitiveType::S4,
    PrimitiveType::S8,
    PrimitiveType::S16,
    PrimitiveType::S32,
    PrimitiveType::S64,
    PrimitiveType::U4,
    PrimitiveType::U8,
    PrimitiveType::U16,
    PrimitiveType::U32,
    PrimitiveType::U64,
    PrimitiveType::F16,
    PrimitiveType::Bf16,
    PrimitiveType::F32,
    PrimitiveType::F64,
    PrimitiveType::F8E4M3FN,
    PrimitiveType::F8E5M2,
    PrimitiveType::C64,
    PrimitiveType::C128,
];

/// splitmix64.
pub struct SplitMix(pub u64);

impl SplitMix {
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    pub fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
    /// A small float that is exact in every float type (sums stay finite).
    pub fn small_float(&mut self) -> f64 {
        (self.below(17) as f64 - 8.0) / 4.0
    }
    pub fn shuffle<T>(&mut self, v: &mut [T]) {
        for i in (1..v.len()).rev() {
            let j = self.below(i + 1);
            v.swap(i, j);
        }
    }
}

/// A buffer of random valid values of `dtype`.
pub fn random_buffer(dtype: PrimitiveType, dims: &[i64], rng: &mut SplitMix) -> DeviceBuffer {
    let n = element_count(dims).unwrap();
    let esize = element_size(dtype).unwrap();
    let mut bytes = HostBytes::zeroed(n * esize);
    let b = bytes.as_bytes_mut();
    for i in 0..n {
        let e = &mut b[i * esize..(i + 1) * esize];
        match dtype.class() {
            TypeClass::Pred => e[0] = (rng.next() & 1) as u8,
            TypeClass::Signed | TypeClass::Unsigned if dtype.bit_width() < 8 => {
                let bits = dtype.bit_width();
                let v = (rng.next() as u8) & ((1u16 << bits) - 1) as u8;
                e[0] = if dtype.is_signed_int() {
                    (((v << (8 - bits)) as i8) >> (8 - bits)) as u8
                } else {
                    v
                };
            }
            TypeClass::Signed | TypeClass::Unsigned => {
                // Mix small values (so min/max/products are interesting)
                // with full-width ones (so wrapping is exercised).
                let v = if rng.below(2) == 0 {
                    rng.next()
                } else {
                    rng.below(7) as u64
                };
                e.copy_from_slice(&v.to_le_bytes()[..esize]);
            }
            TypeClass::Float => {
                let x = rng.small_float();
                match dtype {
                    PrimitiveType::F16 => e.copy_from_slice(&f16::from_f64(x).to_le_bytes()),
                    PrimitiveType::Bf16 => e.copy_from_slice(&bf16::from_f64(x).to_le_bytes()),
                    PrimitiveType::F32 => e.copy_from_slice(&(x as f32).to_le_bytes()),
                    PrimitiveType::F64 => e.copy_from_slice(&x.to_le_bytes()),
                    _ => e[0] = dtype.minifloat_format().unwrap().encode(x) as u8,
                }
            }
            TypeClass::Complex => {
                if dtype == PrimitiveType::C64 {
                    e[..4].copy_from_slice(&(rng.small_float() as f32).to_le_bytes());
                    e[4..].copy_from_slice(&(rng.small_float() as f32).to_le_bytes());
                } else {
                    e[..8].copy_from_slice(&rng.small_float().to_le_bytes());
                    e[8..].copy_from_slice(&rng.small_float().to_le_bytes());
                }
            }
            _ => unreachable!(),
        }
    }
    DeviceBuffer::new(dtype, dims.to_vec(), bytes).unwrap()
}

/// Float value of element `i` for float types, `None` otherwise.
fn float_at(b: &DeviceBuffer, i: usize) -> Option<f64> {
    let e = &b.bytes()[i * b.element_size()..(i + 1) * b.element_size()];
    Some(match b.dtype() {
        PrimitiveType::F16 => f16::from_le_bytes([e[0], e[1]]).to_f64(),
        PrimitiveType::Bf16 => bf16::from_le_bytes([e[0], e[1]]).to_f64(),
        PrimitiveType::F32 => f32::from_le_bytes(e.try_into().ok()?) as f64,
        PrimitiveType::F64 => f64::from_le_bytes(e.try_into().ok()?),
        t if t.is_float() => t.minifloat_format()?.decode(e[0] as u32),
        _ => return None,
    })
}

/// Equality of buffers where any two NaNs are equal (payloads may differ).
pub fn assert_same(actual: &DeviceBuffer, expected: &DeviceBuffer, what: &str) {
    assert_eq!(actual.dtype(), expected.dtype(), "{what}: dtype");
    assert_eq!(actual.dims(), expected.dims(), "{what}: dims");
    if actual.bytes() == expected.bytes() {
        return;
    }
    let n = actual.element_count();
    let es = actual.element_size();
    for i in 0..n {
        let (a, e) = (
            &actual.bytes()[i * es..(i + 1) * es],
            &expected.bytes()[i * es..(i + 1) * es],
        );
        if a == e {
            continue;
        }
        match (float_at(actual, i), float_at(expected, i)) {
            (Some(x), Some(y)) if x.is_nan() && y.is_nan() => continue,
            _ => panic!(
                "{what}: element {i} of {} differs: got {a:?}, expected {e:?}",
                actual.shape_string()
            ),
        }
    }
}

/// Random disjoint groups covering `0..n`: equal sizes (a divisor of n) when
/// `equal`, otherwise arbitrary sizes.
pub fn random_groups(n: usize, equal: bool, rng: &mut SplitMix) -> Vec<Vec<DeviceId>> {
    let mut devices: Vec<DeviceId> = (0..n).collect();
    rng.shuffle(&mut devices);
    if equal {
        let divisors: Vec<usize> = (1..=n).filter(|d| n % d == 0).collect();
        let size = divisors[rng.below(divisors.len())];
        devices.chunks(size).map(|c| c.to_vec()).collect()
    } else {
        let mut groups = Vec::new();
        let mut rest = &devices[..];
        while !rest.is_empty() {
            let take = 1 + rng.below(rest.len());
            groups.push(rest[..take].to_vec());
            rest = &rest[take..];
        }
        groups
    }
}

/// The group containing `d`.
pub fn group_of(groups: &[Vec<DeviceId>], d: DeviceId) -> &[DeviceId] {
    groups.iter().find(|g| g.contains(&d)).unwrap()
}

/// Runs `f(device, communicator)` on one thread per device of a fresh
/// world and returns the results in device order.
pub fn run_world<T: Send>(
    n: usize,
    timeout: Duration,
    f: impl Fn(DeviceId, &mut LoopbackCommunicator) -> T + Sync,
) -> Vec<T> {
    let world = LoopbackWorld::new(n, timeout).unwrap();
    let comms = world.communicators().unwrap();
    std::thread::scope(|s| {
        let handles: Vec<_> = comms
            .into_iter()
            .enumerate()
            .map(|(d, mut c)| {
                let f = &f;
                s.spawn(move || f(d, &mut c))
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}
