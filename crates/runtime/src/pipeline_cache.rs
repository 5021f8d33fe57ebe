//! The on-disk pipeline cache: compiled pipelines kept between loads.
//!
//! Creating a pipeline means WGSL → SPIR-V (naga) and SPIR-V → machine code
//! (the driver): 9–56 ms per kernel on an H100, 0.4–0.6 s for a
//! cooperative-matrix kernel. Where the device has wgpu's `PIPELINE_CACHE`
//! (Vulkan), a session hands the driver a [`wgpu::PipelineCache`] filled
//! from a file, and writes the file back when the cache grew, so the next
//! load of the same plan on the same GPU and driver skips the driver's
//! compile.
//!
//! How to use it: put a [`PipelineCacheOptions`] in
//! [`SessionOptions::pipeline_cache`](crate::SessionOptions) — `gerbil-run`
//! passes its user cache directory (`gerbil_cli::env`) unless
//! `--no-pipeline-cache`. The library default is no cache (it never writes
//! to disk unless asked, and reads no environment variable).
//!
//! One file per plan variant and adapter: its name is wgpu's
//! [`pipeline_cache_key`](wgpu::util::pipeline_cache_key) (backend, vendor,
//! device) and a hash of the adapter's name, driver and driver info, the
//! wgpu major version, the shader-checks mode and every kernel the variant
//! compiles (name, entry point, bindings, WGSL). Files are written to a
//! temporary name and renamed, so a reader never sees half a file; deleting
//! the directory at any time is safe.
//!
//! The surprise: the file is never trusted blindly. It carries gerbil's own
//! header (magic, length, checksum) around wgpu's data, and a file that fails
//! it — truncated, corrupt, someone else's, not a regular file, longer or
//! shorter than its header says (read no further than that) — is ignored
//! with a debug log;
//! wgpu then checks its own header (backend, adapter, driver's cache UUID)
//! and a mismatch there is ignored the same way. A bad file costs a cold
//! load, never an error. The cache only guards against accidents, not
//! against someone who can write to the directory (a driver trusts the
//! payload): keep it in a directory only the user writes.

use crate::device::Gpu;
use crate::pipeline::ShaderChecks;
use gerbil_plan::Kernel;
use std::path::{Path, PathBuf};

/// The wgpu major version the cache files are keyed by; a unit test keeps it
/// equal to the workspace's wgpu dependency.
const WGPU_MAJOR: &str = "30";
/// gerbil's file header: magic, format version, payload length, checksum.
const MAGIC: &[u8; 8] = b"GERBILPC";
const FORMAT: u32 = 1;
const HEADER_BYTES: usize = 8 + 4 + 8 + 8;

/// Where and how a session keeps its pipeline cache.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PipelineCacheOptions {
    /// Directory of the cache files (created when first written).
    pub dir: PathBuf,
    /// Read the stored cache. `false` starts cold (an empty cache, as on a
    /// first load) and still writes the file afterwards.
    pub read: bool,
}

impl PipelineCacheOptions {
    /// The cache in `dir`, read and written.
    pub fn in_dir(dir: impl Into<PathBuf>) -> PipelineCacheOptions {
        PipelineCacheOptions {
            dir: dir.into(),
            read: true,
        }
    }
}

/// What the pipeline cache did during a load.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum PipelineCacheState {
    /// No cache was asked for.
    #[default]
    Off,
    /// The device cannot keep pipeline caches (no `PIPELINE_CACHE`: a
    /// backend other than Vulkan, or a browser); pipelines were compiled.
    Unsupported,
    /// No usable stored cache (none yet, ignored as corrupt or foreign, or
    /// not read): pipelines were compiled, and the cache written.
    Cold,
    /// A stored cache was handed to the driver.
    Warm,
}

impl PipelineCacheState {
    /// `off`, `unsupported`, `cold` or `warm`.
    pub fn name(self) -> &'static str {
        match self {
            PipelineCacheState::Off => "off",
            PipelineCacheState::Unsupported => "unsupported",
            PipelineCacheState::Cold => "cold",
            PipelineCacheState::Warm => "warm",
        }
    }
}

/// 64-bit FNV-1a, stable across builds and platforms (std's hashers are not
/// promised to be): names cache files and checks their payload.
#[derive(Clone, Copy)]
struct Fnv(u64);

impl Fnv {
    fn new() -> Fnv {
        Fnv(0xcbf2_9ce4_8422_2325)
    }

    fn bytes(mut self, data: &[u8]) -> Fnv {
        for &b in data {
            self.0 = (self.0 ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
        }
        self
    }

    /// A length-prefixed field, so that ("ab", "c") and ("a", "bc") differ.
    fn field(self, data: &[u8]) -> Fnv {
        self.bytes(&(data.len() as u64).to_le_bytes()).bytes(data)
    }
}

/// The cache file's name for `kernels` on `adapter`, or `None` where wgpu
/// keeps no cache data for the adapter's backend.
pub fn file_name(
    adapter: &wgpu::AdapterInfo,
    kernels: &[&Kernel],
    checks: ShaderChecks,
) -> Option<String> {
    let key = wgpu::util::pipeline_cache_key(adapter)?;
    let mut h = Fnv::new()
        .field(WGPU_MAJOR.as_bytes())
        .field(adapter.name.as_bytes())
        .field(adapter.driver.as_bytes())
        .field(adapter.driver_info.as_bytes())
        .field(format!("{:?} {checks:?}", adapter.backend).as_bytes());
    for k in kernels {
        h = h
            .field(k.name.as_bytes())
            .field(k.entry.as_bytes())
            .field(format!("{:?}", k.bindings).as_bytes())
            .field(k.wgsl.as_bytes());
    }
    Some(format!("{key}_{:016x}.bin", h.0))
}

/// `payload` behind gerbil's header.
fn wrap(payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEADER_BYTES + payload.len());
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&FORMAT.to_le_bytes());
    out.extend_from_slice(&(payload.len() as u64).to_le_bytes());
    out.extend_from_slice(&Fnv::new().bytes(payload).0.to_le_bytes());
    out.extend_from_slice(payload);
    out
}

/// The payload of a file `wrap` wrote, or why the file is unusable.
fn unwrap(file: &[u8]) -> Result<&[u8], &'static str> {
    if file.len() < HEADER_BYTES || &file[..8] != MAGIC {
        return Err("not a gerbil pipeline cache");
    }
    let word = |at: usize| {
        let mut b = [0u8; 8];
        b.copy_from_slice(&file[at..at + 8]);
        u64::from_le_bytes(b)
    };
    if file[8..12] != FORMAT.to_le_bytes() {
        return Err("written in another format version");
    }
    let payload = &file[HEADER_BYTES..];
    if word(12) != payload.len() as u64 {
        return Err("truncated or extended");
    }
    if word(20) != Fnv::new().bytes(payload).0 {
        return Err("checksum mismatch (corrupt)");
    }
    Ok(payload)
}

/// A session's pipeline cache while it loads: the wgpu cache its pipelines
/// are created with, and the file it came from and goes back to.
pub(crate) struct Store {
    /// The cache to pass to pipeline creation (`None`: compile without).
    pub(crate) cache: Option<wgpu::PipelineCache>,
    /// What happened.
    pub(crate) state: PipelineCacheState,
    file: Option<PathBuf>,
    /// The payload last read or written, to skip rewriting an unchanged
    /// cache (steps save after creating pipelines, often with nothing new).
    loaded: std::sync::Mutex<Option<Vec<u8>>>,
}

impl Store {
    /// Opens the cache for `kernels` as `opts` asks. Never fails: whatever
    /// goes wrong leaves a cold or absent cache and a debug log.
    pub(crate) async fn open(
        gpu: &Gpu,
        opts: Option<&PipelineCacheOptions>,
        kernels: &[&Kernel],
        checks: ShaderChecks,
    ) -> Store {
        let mut store = Store {
            cache: None,
            state: PipelineCacheState::Off,
            file: None,
            loaded: std::sync::Mutex::new(None),
        };
        let Some(opts) = opts else {
            return store;
        };
        store.state = PipelineCacheState::Unsupported;
        let has_feature = gpu
            .device
            .features()
            .contains(wgpu::Features::PIPELINE_CACHE);
        let Some(name) = file_name(&gpu.adapter, kernels, checks).filter(|_| has_feature) else {
            tracing::debug!(
                "no pipeline cache: {} ({:?}) cannot keep one",
                gpu.adapter.name,
                gpu.adapter.backend
            );
            return store;
        };
        let path = opts.dir.join(name);
        let payload = if opts.read { read(&path) } else { None };
        if let Some(data) = payload {
            match create(gpu, Some(&data)).await {
                Ok(cache) => {
                    tracing::debug!(
                        "pipeline cache: {} bytes from {}",
                        data.len(),
                        path.display()
                    );
                    store.cache = Some(cache);
                    store.state = PipelineCacheState::Warm;
                    store.loaded = std::sync::Mutex::new(Some(data));
                }
                Err(e) => tracing::debug!("ignoring pipeline cache {}: {e}", path.display()),
            }
        }
        if store.cache.is_none() {
            match create(gpu, None).await {
                Ok(cache) => {
                    store.cache = Some(cache);
                    store.state = PipelineCacheState::Cold;
                }
                Err(e) => {
                    tracing::debug!("no pipeline cache: {e}");
                    return store;
                }
            }
        }
        store.file = Some(path);
        store
    }

    /// Writes the cache back to its file if it holds anything new. Failing
    /// to write (a read-only directory, a full disk) is logged, not an error.
    /// Never reached in a browser: WebGPU has no `PIPELINE_CACHE`, so no
    /// store there has a cache (and std has no clock or process id there).
    pub(crate) fn save(&self) {
        let (Some(cache), Some(path)) = (&self.cache, &self.file) else {
            return;
        };
        // Held from taking the data to writing it: the background pipeline
        // thread saves too, and an older snapshot written after a newer one
        // would lose pipelines.
        let Ok(mut last) = self.loaded.lock() else {
            return;
        };
        let Some(data) = cache.get_data() else {
            return;
        };
        if last.as_deref() == Some(&data[..]) {
            return;
        }
        match write_atomically(path, &wrap(&data)) {
            Ok(()) => {
                tracing::debug!("pipeline cache: {} bytes to {}", data.len(), path.display());
                *last = Some(data);
            }
            Err(e) => tracing::warn!("could not write the pipeline cache {}: {e}", path.display()),
        }
    }
}

/// The payload stored at `path`, or `None` (logged) when there is none or
/// it is unusable.
fn read(path: &Path) -> Option<Vec<u8>> {
    let file = match read_bounded(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return None,
        Err(e) => {
            tracing::debug!("ignoring pipeline cache {}: {e}", path.display());
            return None;
        }
    };
    match unwrap(&file) {
        Ok(payload) => Some(payload.to_vec()),
        Err(why) => {
            tracing::debug!("ignoring pipeline cache {}: {why}", path.display());
            None
        }
    }
}

/// The bytes of the regular file at `path`, read only as far as its header
/// says it reaches (and never past the size the file system reports): a
/// FIFO, a device or a directory put there is refused before it is opened
/// for reading (opening a FIFO would wait for a writer), and a file that
/// claims more than it holds is refused before anything of that size is
/// allocated.
fn read_bounded(path: &Path) -> std::io::Result<Vec<u8>> {
    use std::io::{Error, ErrorKind, Read};
    let not_regular = || Error::new(ErrorKind::InvalidData, "not a regular file");
    if !std::fs::metadata(path)?.is_file() {
        return Err(not_regular());
    }
    let mut file = std::fs::File::open(path)?;
    let size = file.metadata()?;
    if !size.is_file() {
        return Err(not_regular());
    }
    let mut header = vec![0u8; HEADER_BYTES];
    file.read_exact(&mut header)?;
    let mut length = [0u8; 8];
    length.copy_from_slice(&header[12..20]);
    let declared = u64::from_le_bytes(length);
    if declared != size.len().saturating_sub(HEADER_BYTES as u64) {
        return Err(Error::new(
            ErrorKind::InvalidData,
            "its header's length is not the file's",
        ));
    }
    let mut bytes = header;
    file.take(declared).read_to_end(&mut bytes)?;
    Ok(bytes)
}

/// A wgpu pipeline cache with `data` (or empty), inside error scopes: wgpu
/// reports data made for another adapter as a validation error.
async fn create(
    gpu: &Gpu,
    data: Option<&[u8]>,
) -> Result<wgpu::PipelineCache, crate::RuntimeError> {
    gpu.scoped("creating the pipeline cache", || {
        // SAFETY: `data` is a payload `Store::save` wrote from
        // `PipelineCache::get_data` (gerbil's header checked its length and
        // checksum) under a name keyed by this adapter, and wgpu checks its
        // own header (backend, adapter, the driver's cache UUID) before the
        // driver sees it.
        unsafe {
            gpu.device
                .create_pipeline_cache(&wgpu::PipelineCacheDescriptor {
                    label: Some("gerbil pipelines"),
                    data,
                    fallback: true,
                })
        }
    })
    .await
}

/// Writes `bytes` to a temporary file beside `path` and renames it over
/// `path`, so concurrent readers see the old file or the new one.
fn write_atomically(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir)?;
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(format!(".tmp-{}-{nanos}", std::process::id()));
    let tmp = PathBuf::from(tmp);
    let written = std::fs::write(&tmp, bytes).and_then(|()| std::fs::rename(&tmp, path));
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_wrapped_payload_reads_back_and_any_damage_is_refused() {
        let payload: Vec<u8> = (0..1000u32).map(|i| (i * 31 % 251) as u8).collect();
        let file = wrap(&payload);
        assert_eq!(unwrap(&file), Ok(&payload[..]));
        assert!(unwrap(&file[..file.len() - 1]).is_err(), "truncated");
        assert!(unwrap(&file[..10]).is_err(), "shorter than the header");
        let mut flipped = file.clone();
        flipped[HEADER_BYTES + 500] ^= 1;
        assert_eq!(unwrap(&flipped), Err("checksum mismatch (corrupt)"));
        let mut longer = file.clone();
        longer.push(0);
        assert!(unwrap(&longer).is_err(), "extended");
        assert!(unwrap(b"WGPUPLCH and then some bytes of another format").is_err());
    }

    fn kernel(wgsl: &str) -> Kernel {
        Kernel {
            op: Default::default(),
            name: "k".into(),
            wgsl: wgsl.into(),
            entry: "main".into(),
            workgroup_size: [64, 1, 1],
            bindings: vec![],
        }
    }

    #[test]
    fn only_regular_files_of_their_declared_length_are_read() {
        let dir = std::env::temp_dir().join(format!("gerbil-pc-read-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let good = dir.join("good");
        let file = wrap(b"payload");
        std::fs::write(&good, &file).unwrap();
        assert_eq!(read(&good), Some(b"payload".to_vec()));
        // A header claiming more than the file holds, a directory, a device.
        let mut long = file.clone();
        long[12..20].copy_from_slice(&(1u64 << 40).to_le_bytes());
        let claims = dir.join("claims");
        std::fs::write(&claims, &long).unwrap();
        assert!(read_bounded(&claims).is_err());
        assert_eq!(read(&dir), None);
        #[cfg(unix)]
        assert!(read_bounded(Path::new("/dev/zero")).is_err());
        assert_eq!(read(&dir.join("missing")), None);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn file_names_follow_the_adapter_and_every_kernel() {
        let adapter = wgpu::AdapterInfo {
            name: "gpu".into(),
            vendor: 0x10de,
            device: 0x2330,
            device_type: wgpu::DeviceType::DiscreteGpu,
            device_pci_bus_id: String::new(),
            driver: "NVIDIA".into(),
            driver_info: "580.159.04".into(),
            backend: wgpu::Backend::Vulkan,
            subgroup_min_size: 32,
            subgroup_max_size: 32,
            transient_saves_memory: None,
            limit_bucket: None,
        };
        let (a, b) = (kernel("fn a"), kernel("fn b"));
        let name = |info: &wgpu::AdapterInfo, ks: &[&Kernel], c| file_name(info, ks, c).unwrap();
        let base = name(&adapter, &[&a, &b], ShaderChecks::Unchecked);
        assert!(
            base.starts_with("wgpu_pipeline_cache_vulkan_4318_9008_"),
            "{base}"
        );
        assert_eq!(base, name(&adapter, &[&a, &b], ShaderChecks::Unchecked));
        assert_ne!(base, name(&adapter, &[&a], ShaderChecks::Unchecked));
        assert_ne!(base, name(&adapter, &[&a, &b], ShaderChecks::Checked));
        let newer = wgpu::AdapterInfo {
            driver_info: "590.1".into(),
            ..adapter.clone()
        };
        assert_ne!(base, name(&newer, &[&a, &b], ShaderChecks::Unchecked));
        let metal = wgpu::AdapterInfo {
            backend: wgpu::Backend::Metal,
            ..adapter
        };
        assert_eq!(file_name(&metal, &[&a], ShaderChecks::Unchecked), None);
    }

    #[test]
    fn the_wgpu_version_in_the_key_is_the_workspace_dependency() {
        let manifest = include_str!("../../../Cargo.toml");
        let wanted = format!("wgpu = {{ version = \"{WGPU_MAJOR}\"");
        assert!(
            manifest.contains(&wanted),
            "bump WGPU_MAJOR with the workspace's wgpu dependency"
        );
    }

    #[test]
    fn an_atomic_write_replaces_the_file_and_leaves_no_temporary() {
        let dir = std::env::temp_dir().join(format!("gerbil-pc-{}", std::process::id()));
        let path = dir.join("sub").join("cache.bin");
        write_atomically(&path, b"one").unwrap();
        write_atomically(&path, b"two").unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"two");
        let names: Vec<_> = std::fs::read_dir(path.parent().unwrap())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, vec![std::ffi::OsString::from("cache.bin")]);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
