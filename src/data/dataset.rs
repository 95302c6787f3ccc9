//! A deterministic synthetic image dataset, written as loose files and as one packed file, and
//! the three ways of reading an image's encoded bytes back (`ram`, `mmap`, `stream`).
//!
//! Image `i` of a dataset with seed `s` depends only on `(s, i)`: its width and height are drawn
//! in `[min, max]` px, its content is a colour gradient, a few filled discs and rectangles and
//! per-pixel noise of ±12 levels (so JPEG and PNG compress it like a photograph, not like a flat
//! colour, and decoding costs what it costs). It is encoded as JPEG (quality 90) or PNG by the
//! format list, cycling (`jpeg,png`: even indices JPEG, odd PNG). Same seed and sizes → the
//! same bytes (tested); the bytes depend on the pinned `image` and `rand` versions.
//!
//! Layout of `DIR`: `images/NNNNNN.jpg|png` (loose files), `pack.bin` (the same encodings back
//! to back), `manifest.json` (seed, sizes, and each image's file name, format, offset and
//! length in the pack).

use std::io::Cursor;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context, bail};
use image::{ImageFormat, RgbImage};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rayon::prelude::*;
use serde::{Deserialize, Serialize};

use super::Storage;

/// Encoding of one image.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Format {
    Jpeg,
    Png,
}

impl Format {
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "jpeg" | "jpg" => Some(Format::Jpeg),
            "png" => Some(Format::Png),
            _ => None,
        }
    }

    fn ext(self) -> &'static str {
        match self {
            Format::Jpeg => "jpg",
            Format::Png => "png",
        }
    }

    pub fn image_format(self) -> ImageFormat {
        match self {
            Format::Jpeg => ImageFormat::Jpeg,
            Format::Png => ImageFormat::Png,
        }
    }
}

/// What `memfit dataset make` is asked for.
#[derive(Debug, Clone, PartialEq)]
pub struct Spec {
    pub seed: u64,
    pub count: usize,
    /// Smallest and largest side in pixels (inclusive).
    pub min_px: u32,
    pub max_px: u32,
    /// Formats, cycled over the indices.
    pub formats: Vec<Format>,
}

/// One image in the manifest.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Entry {
    /// Path under the dataset folder (`images/000000.jpg`).
    pub file: String,
    pub format: Format,
    pub width: u32,
    pub height: u32,
    /// Byte offset and length of the encoding in `pack.bin`.
    pub offset: u64,
    pub len: u64,
}

/// `manifest.json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Manifest {
    pub seed: u64,
    pub min_px: u32,
    pub max_px: u32,
    pub pack: String,
    pub pack_bytes: u64,
    pub entries: Vec<Entry>,
}

pub const MANIFEST: &str = "manifest.json";
pub const PACK: &str = "pack.bin";

/// splitmix64: a per-image seed from the dataset seed and the index.
pub fn mix(seed: u64, i: u64) -> u64 {
    let mut z = seed ^ i.wrapping_add(1).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The pixels of image `i` (pure: depends only on the arguments).
pub fn synth_image(seed: u64, i: u64, min_px: u32, max_px: u32) -> RgbImage {
    let mut rng = StdRng::seed_from_u64(mix(seed, i));
    let w = rng.random_range(min_px..=max_px);
    let h = rng.random_range(min_px..=max_px);
    let c0: [f32; 3] = [rng.random(), rng.random(), rng.random()];
    let c1: [f32; 3] = [rng.random(), rng.random(), rng.random()];
    let angle: f32 = rng.random_range(0.0..std::f32::consts::TAU);
    let (dx, dy) = (angle.cos(), angle.sin());
    let mut img = RgbImage::new(w, h);
    let norm = (w.max(h)) as f32;
    for (x, y, p) in img.enumerate_pixels_mut() {
        let t = (((x as f32 * dx + y as f32 * dy) / norm) * 0.5 + 0.5).clamp(0.0, 1.0);
        for c in 0..3 {
            p[c] = ((c0[c] * (1.0 - t) + c1[c] * t) * 255.0) as u8;
        }
    }
    // Shapes: discs and rectangles of random colours.
    for _ in 0..rng.random_range(3..9) {
        let col = [rng.random::<u8>(), rng.random::<u8>(), rng.random::<u8>()];
        let cx = rng.random_range(0..w) as i64;
        let cy = rng.random_range(0..h) as i64;
        let r = rng.random_range(8..=(min_px as i64 / 3).max(9));
        let disc = rng.random::<bool>();
        let (x0, x1) = ((cx - r).max(0), (cx + r).min(w as i64 - 1));
        let (y0, y1) = ((cy - r).max(0), (cy + r).min(h as i64 - 1));
        for y in y0..=y1 {
            for x in x0..=x1 {
                if !disc || (x - cx).pow(2) + (y - cy).pow(2) <= r * r {
                    img.put_pixel(x as u32, y as u32, image::Rgb(col));
                }
            }
        }
    }
    // Sensor-like noise.
    for p in img.pixels_mut() {
        for c in 0..3 {
            let n = rng.random_range(-12i16..=12);
            p[c] = (p[c] as i16 + n).clamp(0, 255) as u8;
        }
    }
    img
}

/// The encoding of `img` in `format` (JPEG quality 90).
pub fn encode(img: &RgbImage, format: Format) -> anyhow::Result<Vec<u8>> {
    let mut out = Vec::new();
    match format {
        Format::Jpeg => {
            image::codecs::jpeg::JpegEncoder::new_with_quality(&mut out, 90)
                .encode_image(img)
                .context("encoding JPEG")?;
        }
        Format::Png => {
            img.write_to(&mut Cursor::new(&mut out), ImageFormat::Png)
                .context("encoding PNG")?;
        }
    }
    Ok(out)
}

/// One encoded image: format, width, height, bytes.
pub type Encoded = (Format, u32, u32, Vec<u8>);

/// The encoded images of a spec, in index order (pure; parallel over the rayon pool).
pub fn encoded(spec: &Spec) -> anyhow::Result<Vec<Encoded>> {
    (0..spec.count)
        .into_par_iter()
        .map(|i| {
            let img = synth_image(spec.seed, i as u64, spec.min_px, spec.max_px);
            let format = spec.formats[i % spec.formats.len()];
            Ok((format, img.width(), img.height(), encode(&img, format)?))
        })
        .collect()
}

/// Writes the dataset into `dir` (created; must not already hold a manifest).
pub fn make(dir: &Path, spec: &Spec) -> anyhow::Result<Manifest> {
    if spec.formats.is_empty() || spec.count == 0 || spec.min_px == 0 || spec.min_px > spec.max_px {
        bail!("a dataset needs at least one image, one format and 1 ≤ min px ≤ max px");
    }
    if dir.join(MANIFEST).exists() {
        bail!(
            "{} already holds a dataset; choose another --out or remove it",
            dir.display()
        );
    }
    std::fs::create_dir_all(dir.join("images"))
        .with_context(|| format!("creating {}", dir.display()))?;
    let images = encoded(spec)?;
    let mut entries = Vec::with_capacity(images.len());
    let mut pack = Vec::new();
    for (i, (format, width, height, bytes)) in images.into_iter().enumerate() {
        let file = format!("images/{i:06}.{}", format.ext());
        std::fs::write(dir.join(&file), &bytes).with_context(|| format!("writing {file}"))?;
        entries.push(Entry {
            file,
            format,
            width,
            height,
            offset: pack.len() as u64,
            len: bytes.len() as u64,
        });
        pack.extend_from_slice(&bytes);
    }
    std::fs::write(dir.join(PACK), &pack).context("writing pack.bin")?;
    let manifest = Manifest {
        seed: spec.seed,
        min_px: spec.min_px,
        max_px: spec.max_px,
        pack: PACK.into(),
        pack_bytes: pack.len() as u64,
        entries,
    };
    std::fs::write(
        dir.join(MANIFEST),
        serde_json::to_string_pretty(&manifest)? + "\n",
    )
    .context("writing manifest.json")?;
    Ok(manifest)
}

/// Reads `DIR/manifest.json`.
pub fn read_manifest(dir: &Path) -> anyhow::Result<Manifest> {
    let path = dir.join(MANIFEST);
    let text = std::fs::read_to_string(&path).with_context(|| {
        format!(
            "reading {} (make one with `memfit dataset make --out {}`)",
            path.display(),
            dir.display()
        )
    })?;
    serde_json::from_str(&text).with_context(|| format!("parsing {}", path.display()))
}

/// The encoded bytes behind a storage mode.
pub enum Bytes {
    Ram(Vec<u8>),
    Mmap(memmap2::Mmap),
    Stream(PathBuf),
}

/// A dataset opened in one storage mode: gives each image's encoded bytes.
pub struct Source {
    pub manifest: Arc<Manifest>,
    bytes: Bytes,
}

impl Source {
    /// Opens `dir` in `storage` mode: `ram` reads the pack whole (its pages touched), `mmap`
    /// maps it, `stream` reads nothing yet.
    pub fn open(dir: &Path, storage: Storage) -> anyhow::Result<Source> {
        let manifest = Arc::new(read_manifest(dir)?);
        let pack = dir.join(&manifest.pack);
        let bytes = match storage {
            Storage::Ram => Bytes::Ram(
                std::fs::read(&pack).with_context(|| format!("reading {}", pack.display()))?,
            ),
            Storage::Mmap => {
                let f = std::fs::File::open(&pack)
                    .with_context(|| format!("opening {}", pack.display()))?;
                // SAFETY: the pack is written once by `make` and only read afterwards.
                Bytes::Mmap(
                    unsafe { memmap2::Mmap::map(&f) }
                        .with_context(|| format!("mapping {}", pack.display()))?,
                )
            }
            Storage::Stream => Bytes::Stream(dir.to_path_buf()),
        };
        let s = Source { manifest, bytes };
        if let Some(len) = s.pack_len()
            && len != s.manifest.pack_bytes
        {
            bail!(
                "{}: {len} bytes, the manifest says {}",
                pack.display(),
                s.manifest.pack_bytes
            );
        }
        Ok(s)
    }

    fn pack_len(&self) -> Option<u64> {
        match &self.bytes {
            Bytes::Ram(v) => Some(v.len() as u64),
            Bytes::Mmap(m) => Some(m.len() as u64),
            Bytes::Stream(_) => None,
        }
    }

    pub fn len(&self) -> usize {
        self.manifest.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.manifest.entries.is_empty()
    }

    /// Calls `f` with the encoded bytes of image `i` (borrowed from the pack, or read from its
    /// loose file).
    pub fn with_bytes<T>(&self, i: usize, f: impl FnOnce(&[u8]) -> T) -> anyhow::Result<T> {
        let e =
            self.manifest.entries.get(i).with_context(|| {
                format!("image {i} is not in the dataset ({} images)", self.len())
            })?;
        let range = e.offset as usize..(e.offset + e.len) as usize;
        match &self.bytes {
            Bytes::Ram(v) => Ok(f(&v[range])),
            Bytes::Mmap(m) => Ok(f(&m[range])),
            Bytes::Stream(dir) => {
                let path = dir.join(&e.file);
                let v =
                    std::fs::read(&path).with_context(|| format!("reading {}", path.display()))?;
                Ok(f(&v))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn images_depend_only_on_seed_and_index() {
        let a = synth_image(7, 3, 40, 60);
        let b = synth_image(7, 3, 40, 60);
        assert_eq!(a.as_raw(), b.as_raw());
        assert!((40..=60).contains(&a.width()) && (40..=60).contains(&a.height()));
        let c = synth_image(8, 3, 40, 60);
        assert_ne!(a.as_raw(), c.as_raw());
        assert_ne!(mix(1, 0), mix(1, 1));
    }

    #[test]
    fn encodings_decode_to_the_same_size() {
        let img = synth_image(1, 0, 33, 33);
        for f in [Format::Jpeg, Format::Png] {
            let bytes = encode(&img, f).unwrap();
            let back = image::load_from_memory_with_format(&bytes, f.image_format()).unwrap();
            assert_eq!((back.width(), back.height()), (33, 33));
        }
        // PNG is lossless.
        let png = encode(&img, Format::Png).unwrap();
        let back = image::load_from_memory(&png).unwrap().into_rgb8();
        assert_eq!(back.as_raw(), img.as_raw());
    }
}
