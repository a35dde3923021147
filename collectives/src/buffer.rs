//! Typed dense host arrays: the values collectives consume and produce.
//!
//! A [`DeviceBuffer`] is an element type, a shape and shared, immutable,
//! 8-byte-aligned storage ([`HostBytes`] behind an `Arc`). Collectives pass
//! storage between ranks by reference count, never by copy, wherever XLA's
//! semantics let several devices hold the same value (broadcast, permute,
//! the all-reduce and all-gather results, the tuple all-to-all); a rank that
//! wants to write into a shared value gets its own copy from
//! [`DeviceBuffer::make_mut`] (copy on write).
//!
//! Invariants, checked by every constructor (none panics on bad input):
//! * `dims` are non-negative and `bytes().len() == product(dims) *
//!   element_size(dtype)`;
//! * the element type holds data (not token/opaque);
//! * storage is row-major, each element little-endian in the layout of
//!   `xla_hlo_ir::literal` (sub-byte integers take one byte holding the value,
//!   pred is one byte 0/1, f8/f6/f4 one byte holding the bit pattern, complex
//!   numbers are (real, imaginary) pairs).

use crate::error::{CollectiveError, Result};
use half::{bf16, f16};
use std::fmt;
use std::sync::Arc;
use xla_hlo_ir::PrimitiveType;

/// Plain-old-data element types: every bit pattern is a valid value and the
/// type has no padding, so byte storage may be viewed as a slice of them.
///
/// # Safety
/// Implement only for types with no padding, no invalid bit patterns and an
/// alignment of at most 8.
pub unsafe trait Pod: Copy + Send + Sync + 'static {}

macro_rules! pod {
    ($($t:ty),*) => { $(unsafe impl Pod for $t {})* };
}
pod!(u8, u16, u32, u64, i8, i16, i32, i64, f32, f64, f16, bf16);

/// Element types with a native Rust representation.
pub trait Element: Pod {
    /// The XLA type of this Rust type.
    const DTYPE: PrimitiveType;
}

macro_rules! element {
    ($($t:ty => $p:ident),*) => { $(impl Element for $t { const DTYPE: PrimitiveType = PrimitiveType::$p; })* };
}
element!(u8 => U8, u16 => U16, u32 => U32, u64 => U64, i8 => S8, i16 => S16, i32 => S32,
    i64 => S64, f32 => F32, f64 => F64, f16 => F16, bf16 => Bf16);

/// Bytes one element of `dtype` occupies in a dense buffer, or an error for
/// types that hold no data (token, opaque).
pub fn element_size(dtype: PrimitiveType) -> Result<usize> {
    if !dtype.is_array_type() {
        return Err(CollectiveError::InvalidArgument(format!(
            "element type {dtype} holds no data"
        )));
    }
    Ok(xla_hlo_ir::literal::storage_bytes(dtype))
}

/// Views `bytes` as a slice of `T` when its address and length allow it.
pub fn cast_slice<T: Pod>(bytes: &[u8]) -> Option<&[T]> {
    let size = std::mem::size_of::<T>();
    if bytes.len() % size != 0 || (bytes.as_ptr() as usize) % std::mem::align_of::<T>() != 0 {
        return None;
    }
    // SAFETY: the pointer is aligned for T, the length is a whole number of
    // T, and T is Pod (every bit pattern valid, no padding).
    Some(unsafe { std::slice::from_raw_parts(bytes.as_ptr() as *const T, bytes.len() / size) })
}

/// Mutable counterpart of [`cast_slice`].
pub fn cast_slice_mut<T: Pod>(bytes: &mut [u8]) -> Option<&mut [T]> {
    let size = std::mem::size_of::<T>();
    if bytes.len() % size != 0 || (bytes.as_ptr() as usize) % std::mem::align_of::<T>() != 0 {
        return None;
    }
    // SAFETY: as in cast_slice; the borrow is unique.
    Some(unsafe {
        std::slice::from_raw_parts_mut(bytes.as_mut_ptr() as *mut T, bytes.len() / size)
    })
}

/// Byte storage aligned to 8 bytes (so it can be viewed as any [`Pod`]
/// element slice).
///
/// Storage made by a [`Recycler`] goes back to it when dropped, so that
/// large buffers are not unmapped and faulted in again on every collective.
pub struct HostBytes {
    words: Vec<u64>,
    len: usize,
    recycler: Option<Arc<Recycler>>,
}

impl Clone for HostBytes {
    fn clone(&self) -> HostBytes {
        HostBytes {
            words: self.words.clone(),
            len: self.len,
            recycler: None,
        }
    }
}

impl PartialEq for HostBytes {
    fn eq(&self, other: &HostBytes) -> bool {
        self.as_bytes() == other.as_bytes()
    }
}

impl Eq for HostBytes {}

impl Drop for HostBytes {
    fn drop(&mut self) {
        if let Some(r) = self.recycler.take() {
            r.put(std::mem::take(&mut self.words));
        }
    }
}

/// A bounded pool of large allocations. Freshly mapped memory costs a page
/// fault per page on first touch (as much as the data traffic of an
/// all-reduce); recycled memory is already mapped.
///
/// Invariant: the pool holds at most `capacity` bytes; buffers below
/// `MIN_RECYCLED` bytes are left to the allocator.
pub struct Recycler {
    free: std::sync::Mutex<Vec<Vec<u64>>>,
    capacity: usize,
}

/// Buffers smaller than this are not pooled.
const MIN_RECYCLED: usize = 256 << 10;

impl Recycler {
    /// A pool keeping at most `capacity` bytes of free buffers.
    pub fn new(capacity: usize) -> Arc<Recycler> {
        Arc::new(Recycler {
            free: std::sync::Mutex::new(Vec::new()),
            capacity,
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Vec<u64>>> {
        self.free.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// `len` bytes of unspecified (but initialized) content; the caller
    /// overwrites all of them.
    pub fn take_uninit(self: &Arc<Self>, len: usize) -> HostBytes {
        let words = len.div_ceil(8);
        if len < MIN_RECYCLED {
            return HostBytes::zeroed(len);
        }
        let reused = {
            let mut free = self.lock();
            // Best fit within 2x, so small requests do not pin big buffers.
            let pick = free
                .iter()
                .enumerate()
                .filter(|(_, v)| v.capacity() >= words && v.capacity() <= 2 * words)
                .min_by_key(|(_, v)| v.capacity())
                .map(|(i, _)| i);
            pick.map(|i| free.swap_remove(i))
        };
        let v = match reused {
            Some(mut v) => {
                // Recycled words are initialized; any tail is zeroed.
                v.truncate(words);
                v.resize(words, 0);
                v
            }
            // Fresh zeroed pages (calloc) are mapped lazily, on first write.
            None => vec![0u64; words],
        };
        HostBytes {
            words: v,
            len,
            recycler: Some(self.clone()),
        }
    }

    /// `len` zero bytes.
    pub fn take_zeroed(self: &Arc<Self>, len: usize) -> HostBytes {
        let mut h = self.take_uninit(len);
        h.as_bytes_mut().fill(0);
        h
    }

    fn put(&self, words: Vec<u64>) {
        let bytes = words.capacity() * 8;
        if bytes < MIN_RECYCLED || bytes > self.capacity {
            return;
        }
        let mut free = self.lock();
        let mut held: usize = free.iter().map(|v| v.capacity() * 8).sum();
        while held + bytes > self.capacity && !free.is_empty() {
            held -= free.remove(0).capacity() * 8;
        }
        free.push(words);
    }

    /// Bytes currently pooled.
    pub fn pooled_bytes(&self) -> usize {
        self.lock().iter().map(|v| v.capacity() * 8).sum()
    }

    /// Frees every pooled buffer.
    pub fn clear(&self) {
        self.lock().clear();
    }
}

impl HostBytes {
    /// `len` zero bytes.
    pub fn zeroed(len: usize) -> HostBytes {
        HostBytes {
            words: vec![0u64; len.div_ceil(8)],
            len,
            recycler: None,
        }
    }

    /// A copy of `bytes`.
    pub fn from_slice(bytes: &[u8]) -> HostBytes {
        let mut h = HostBytes::zeroed(bytes.len());
        h.as_bytes_mut().copy_from_slice(bytes);
        h
    }

    /// A copy of a typed slice.
    pub fn from_typed<T: Pod>(values: &[T]) -> HostBytes {
        let len = std::mem::size_of_val(values);
        let mut h = HostBytes::zeroed(len);
        // SAFETY: T is Pod, so its bytes are initialized and may be read as u8.
        let src = unsafe { std::slice::from_raw_parts(values.as_ptr() as *const u8, len) };
        h.as_bytes_mut().copy_from_slice(src);
        h
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn as_bytes(&self) -> &[u8] {
        // SAFETY: `words` holds at least `len` initialized bytes.
        unsafe { std::slice::from_raw_parts(self.words.as_ptr() as *const u8, self.len) }
    }

    pub fn as_bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in as_bytes; the borrow is unique.
        unsafe { std::slice::from_raw_parts_mut(self.words.as_mut_ptr() as *mut u8, self.len) }
    }

    /// The storage as a slice of `T`; `None` when the length is not a whole
    /// number of `T`.
    pub fn typed<T: Pod>(&self) -> Option<&[T]> {
        cast_slice(self.as_bytes())
    }

    /// Mutable counterpart of [`HostBytes::typed`].
    pub fn typed_mut<T: Pod>(&mut self) -> Option<&mut [T]> {
        cast_slice_mut(self.as_bytes_mut())
    }

    /// Raw pointer to the first byte, for writers that split the buffer
    /// between threads (see `loopback`).
    pub(crate) fn as_mut_ptr(&mut self) -> *mut u8 {
        self.words.as_mut_ptr() as *mut u8
    }
}

impl fmt::Debug for HostBytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "HostBytes({} bytes)", self.len)
    }
}

/// A dense array on one device (host memory for the loopback backend; the
/// NCCL backend stages it through GPU memory).
#[derive(Clone, PartialEq)]
pub struct DeviceBuffer {
    dtype: PrimitiveType,
    dims: Vec<i64>,
    data: Arc<HostBytes>,
}

/// Number of elements of `dims`, or an error for negative dims or overflow.
pub fn element_count(dims: &[i64]) -> Result<usize> {
    let mut n: usize = 1;
    for &d in dims {
        let d = usize::try_from(d).map_err(|_| {
            CollectiveError::InvalidArgument(format!("negative dimension in {dims:?}"))
        })?;
        n = n.checked_mul(d).ok_or_else(|| {
            CollectiveError::InvalidArgument(format!("element count of {dims:?} overflows"))
        })?;
    }
    Ok(n)
}

/// `f32[2,3]`-style spelling of a shape.
pub fn shape_string(dtype: PrimitiveType, dims: &[i64]) -> String {
    let dims: Vec<String> = dims.iter().map(|d| d.to_string()).collect();
    format!("{}[{}]", dtype.name(), dims.join(","))
}

impl DeviceBuffer {
    /// A buffer over shared storage; checks the invariants.
    pub fn from_shared(
        dtype: PrimitiveType,
        dims: Vec<i64>,
        data: Arc<HostBytes>,
    ) -> Result<DeviceBuffer> {
        let esize = element_size(dtype)?;
        let n = element_count(&dims)?;
        let want = n.checked_mul(esize).ok_or_else(|| {
            CollectiveError::InvalidArgument(format!("byte size of {dims:?} overflows"))
        })?;
        if data.len() != want {
            return Err(CollectiveError::InvalidArgument(format!(
                "{} needs {want} bytes, got {}",
                shape_string(dtype, &dims),
                data.len()
            )));
        }
        Ok(DeviceBuffer { dtype, dims, data })
    }

    /// A buffer owning `data`.
    pub fn new(dtype: PrimitiveType, dims: Vec<i64>, data: HostBytes) -> Result<DeviceBuffer> {
        DeviceBuffer::from_shared(dtype, dims, Arc::new(data))
    }

    /// A buffer holding a copy of `bytes`.
    pub fn from_bytes(dtype: PrimitiveType, dims: Vec<i64>, bytes: &[u8]) -> Result<DeviceBuffer> {
        DeviceBuffer::new(dtype, dims, HostBytes::from_slice(bytes))
    }

    /// A buffer holding a copy of typed values.
    pub fn from_slice<T: Element>(dims: Vec<i64>, values: &[T]) -> Result<DeviceBuffer> {
        DeviceBuffer::new(T::DTYPE, dims, HostBytes::from_typed(values))
    }

    /// A zero-filled buffer.
    pub fn zeros(dtype: PrimitiveType, dims: Vec<i64>) -> Result<DeviceBuffer> {
        let n = element_count(&dims)?;
        let bytes = n.checked_mul(element_size(dtype)?).ok_or_else(|| {
            CollectiveError::InvalidArgument(format!("byte size of {dims:?} overflows"))
        })?;
        DeviceBuffer::new(dtype, dims, HostBytes::zeroed(bytes))
    }

    pub fn dtype(&self) -> PrimitiveType {
        self.dtype
    }

    pub fn dims(&self) -> &[i64] {
        &self.dims
    }

    /// Number of elements.
    pub fn element_count(&self) -> usize {
        // Checked at construction.
        self.dims.iter().map(|&d| d as usize).product()
    }

    /// Bytes per element.
    pub fn element_size(&self) -> usize {
        xla_hlo_ir::literal::storage_bytes(self.dtype)
    }

    pub fn bytes(&self) -> &[u8] {
        self.data.as_bytes()
    }

    /// The elements as `T` when `T` is this buffer's element type.
    pub fn typed<T: Element>(&self) -> Option<&[T]> {
        if T::DTYPE != self.dtype {
            return None;
        }
        self.data.typed()
    }

    /// The shared storage.
    pub fn shared_data(&self) -> &Arc<HostBytes> {
        &self.data
    }

    /// Mutable storage; copies it first when another buffer shares it.
    pub fn make_mut(&mut self) -> &mut HostBytes {
        Arc::make_mut(&mut self.data)
    }

    /// The bytes as an owned vector (one copy).
    pub fn to_vec(&self) -> Vec<u8> {
        self.bytes().to_vec()
    }

    /// True when both buffers use the same storage (no copy was made).
    pub fn shares_storage_with(&self, other: &DeviceBuffer) -> bool {
        Arc::ptr_eq(&self.data, &other.data)
    }

    /// Same type and dims.
    pub fn same_shape(&self, other: &DeviceBuffer) -> bool {
        self.dtype == other.dtype && self.dims == other.dims
    }

    /// `f32[2,3]`.
    pub fn shape_string(&self) -> String {
        shape_string(self.dtype, &self.dims)
    }

    /// Same storage, new dims (element count must match).
    pub fn reshaped(&self, dims: Vec<i64>) -> Result<DeviceBuffer> {
        DeviceBuffer::from_shared(self.dtype, dims, self.data.clone())
    }
}

impl fmt::Debug for DeviceBuffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "DeviceBuffer({})", self.shape_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn constructors_check_sizes() {
        assert!(DeviceBuffer::from_bytes(PrimitiveType::F32, vec![2], &[0; 8]).is_ok());
        assert!(DeviceBuffer::from_bytes(PrimitiveType::F32, vec![2], &[0; 7]).is_err());
        assert!(DeviceBuffer::from_bytes(PrimitiveType::F32, vec![-1], &[]).is_err());
        assert!(DeviceBuffer::zeros(PrimitiveType::Token, vec![]).is_err());
        assert!(DeviceBuffer::zeros(PrimitiveType::F32, vec![i64::MAX, i64::MAX]).is_err());
        let b = DeviceBuffer::from_slice(vec![3], &[1.0f32, 2.0, 3.0]).unwrap();
        assert_eq!(b.typed::<f32>().unwrap(), &[1.0, 2.0, 3.0]);
        assert!(b.typed::<i32>().is_none());
        assert_eq!(b.shape_string(), "f32[3]");
        let s4 = DeviceBuffer::zeros(PrimitiveType::S4, vec![5]).unwrap();
        assert_eq!(s4.bytes().len(), 5);
    }

    #[test]
    fn copy_on_write() {
        let a = DeviceBuffer::from_slice(vec![2], &[1i32, 2]).unwrap();
        let mut b = a.clone();
        assert!(a.shares_storage_with(&b));
        b.make_mut().typed_mut::<i32>().unwrap()[0] = 7;
        assert!(!a.shares_storage_with(&b));
        assert_eq!(a.typed::<i32>().unwrap(), &[1, 2]);
        assert_eq!(b.typed::<i32>().unwrap(), &[7, 2]);
    }
}
