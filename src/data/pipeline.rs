//! The per-image pipeline and batching: decode → random resized crop → horizontal flip →
//! colour jitter → normalise, written straight into a `B × 3 × C × C` f32 batch (CHW).
//!
//! As torchvision's `RandomResizedCrop(C, scale=(0.08, 1), ratio=(3/4, 4/3))`,
//! `RandomHorizontalFlip(0.5)`, `ColorJitter(0.4, 0.4, 0.4)` and `Normalize(ImageNet mean, std)`:
//! - crop: up to 10 draws of an area fraction in `[0.08, 1]` and a log-uniform aspect ratio in
//!   `[3/4, 4/3]`; the first box that fits the image is taken at a uniform position, otherwise
//!   the centred largest box of a clamped ratio; it is resized to `C × C` (bilinear,
//!   `fast_image_resize`);
//! - jitter: brightness `x·b`, contrast `(x − mean)·c + mean` (mean of the grey image),
//!   saturation `(x − grey)·s + grey`, each factor uniform in `[0.6, 1.4]`, clamped to `[0, 1]`;
//! - normalise: `(x − mean_c) / std_c`, so every output lies in
//!   `[(0 − mean_c)/std_c, (1 − mean_c)/std_c]` per channel.
//!
//! Temporaries per image (claim D3): the decoded image `W·H·3` bytes (plus the decoder's own
//! buffers) and the resized crop `C²·3` bytes; the batch itself is `B·3·C²·4` bytes.
//!
//! Randomness: image `i` in epoch `e` draws from `StdRng(mix(seed ⊕ e, i))`, so a batch is the
//! same whichever worker (thread or process) makes it; the epoch's order is a Fisher–Yates
//! shuffle seeded by `(seed, e)`.

use anyhow::Context;
use fast_image_resize::images::{Image, ImageRef};
use fast_image_resize::{FilterType, PixelType, ResizeAlg, ResizeOptions, Resizer};
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};

use super::dataset::{Format, Source, mix};

/// ImageNet channel means and standard deviations (torchvision's `Normalize`).
pub const MEAN: [f32; 3] = [0.485, 0.456, 0.406];
pub const STD: [f32; 3] = [0.229, 0.224, 0.225];

/// The range of normalised channel `c`.
pub fn value_range(c: usize) -> (f32, f32) {
    ((0.0 - MEAN[c]) / STD[c], (1.0 - MEAN[c]) / STD[c])
}

/// A crop box in source pixels.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CropBox {
    pub left: u32,
    pub top: u32,
    pub width: u32,
    pub height: u32,
}

/// torchvision's `RandomResizedCrop.get_params` (scale 0.08–1, ratio 3/4–4/3).
pub fn random_resized_crop(w: u32, h: u32, rng: &mut StdRng) -> CropBox {
    let area = (w as f64) * (h as f64);
    let (lr0, lr1) = ((3.0f64 / 4.0).ln(), (4.0f64 / 3.0).ln());
    for _ in 0..10 {
        let target = area * rng.random_range(0.08..=1.0);
        let ratio = rng.random_range(lr0..=lr1).exp();
        let cw = (target * ratio).sqrt().round() as u32;
        let ch = (target / ratio).sqrt().round() as u32;
        if cw > 0 && ch > 0 && cw <= w && ch <= h {
            let left = rng.random_range(0..=w - cw);
            let top = rng.random_range(0..=h - ch);
            return CropBox {
                left,
                top,
                width: cw,
                height: ch,
            };
        }
    }
    // Fallback: the centred box of the clamped ratio.
    let in_ratio = w as f64 / h as f64;
    let (cw, ch) = if in_ratio < 3.0 / 4.0 {
        (w, ((w as f64) / (3.0 / 4.0)).round() as u32)
    } else if in_ratio > 4.0 / 3.0 {
        (((h as f64) * (4.0 / 3.0)).round() as u32, h)
    } else {
        (w, h)
    };
    let (cw, ch) = (cw.clamp(1, w), ch.clamp(1, h));
    CropBox {
        left: (w - cw) / 2,
        top: (h - ch) / 2,
        width: cw,
        height: ch,
    }
}

/// The random generator of image `index` in `epoch`.
pub fn sample_rng(seed: u64, epoch: u64, index: u64) -> StdRng {
    StdRng::seed_from_u64(mix(seed ^ epoch.wrapping_mul(0xA24B_AED4_963E_E407), index))
}

/// The order of an epoch: a seeded shuffle of `0..n`.
pub fn epoch_order(n: usize, seed: u64, epoch: u64) -> Vec<u32> {
    let mut order: Vec<u32> = (0..n as u32).collect();
    order.shuffle(&mut StdRng::seed_from_u64(mix(seed, u64::MAX - epoch)));
    order
}

/// Turns encoded images into normalised crops; keeps its resizer's buffers between calls.
pub struct Pipeline {
    crop: u32,
    resizer: Resizer,
    resized: Image<'static>,
}

impl Pipeline {
    pub fn new(crop: u32) -> Pipeline {
        Pipeline {
            crop,
            resizer: Resizer::new(),
            resized: Image::new(crop, crop, PixelType::U8x3),
        }
    }

    pub fn crop(&self) -> u32 {
        self.crop
    }

    /// One image: decode, augment, normalise into `out` (`3 · C²` floats, CHW).
    pub fn sample(
        &mut self,
        bytes: &[u8],
        format: Format,
        rng: &mut StdRng,
        out: &mut [f32],
    ) -> anyhow::Result<()> {
        let c = self.crop as usize;
        anyhow::ensure!(out.len() == 3 * c * c, "output slice of the wrong size");
        let decoded = image::load_from_memory_with_format(bytes, format.image_format())
            .context("decoding")?
            .into_rgb8();
        let (w, h) = decoded.dimensions();
        let b = random_resized_crop(w, h, rng);
        let src = ImageRef::new(w, h, decoded.as_raw(), PixelType::U8x3)
            .map_err(|e| anyhow::anyhow!("source image: {e}"))?;
        let options = ResizeOptions::new()
            .resize_alg(ResizeAlg::Convolution(FilterType::Bilinear))
            .crop(b.left as f64, b.top as f64, b.width as f64, b.height as f64);
        self.resizer
            .resize(&src, &mut self.resized, &options)
            .map_err(|e| anyhow::anyhow!("resizing: {e}"))?;
        drop(decoded);
        let flip = rng.random_bool(0.5);
        let bright = rng.random_range(0.6f32..=1.4);
        let contrast = rng.random_range(0.6f32..=1.4);
        let saturation = rng.random_range(0.6f32..=1.4);
        let px = self.resized.buffer();
        let grey = |p: &[f32; 3]| 0.299 * p[0] + 0.587 * p[1] + 0.114 * p[2];
        // Brightness first, then the grey mean that contrast pulls towards.
        let mut mean = 0f32;
        for k in 0..c * c {
            let p = [
                px[3 * k] as f32 / 255.0 * bright,
                px[3 * k + 1] as f32 / 255.0 * bright,
                px[3 * k + 2] as f32 / 255.0 * bright,
            ];
            mean += grey(&p.map(|v| v.min(1.0)));
        }
        mean /= (c * c) as f32;
        let plane = c * c;
        for y in 0..c {
            for x in 0..c {
                let sx = if flip { c - 1 - x } else { x };
                let k = y * c + sx;
                let mut p = [0f32; 3];
                for ch in 0..3 {
                    let v = (px[3 * k + ch] as f32 / 255.0 * bright).min(1.0);
                    p[ch] = ((v - mean) * contrast + mean).clamp(0.0, 1.0);
                }
                let g = grey(&p);
                for ch in 0..3 {
                    let v = ((p[ch] - g) * saturation + g).clamp(0.0, 1.0);
                    out[ch * plane + y * c + x] = (v - MEAN[ch]) / STD[ch];
                }
            }
        }
        Ok(())
    }

    /// One batch: the images `indices` of `epoch`, `len · 3 · C²` floats.
    pub fn batch(
        &mut self,
        source: &Source,
        indices: &[u32],
        seed: u64,
        epoch: u64,
    ) -> anyhow::Result<Vec<f32>> {
        let per = 3 * (self.crop as usize).pow(2);
        let mut out = vec![0f32; indices.len() * per];
        for (slot, &i) in out.chunks_exact_mut(per).zip(indices) {
            let format = source
                .manifest
                .entries
                .get(i as usize)
                .with_context(|| format!("image {i} is not in the dataset"))?
                .format;
            let mut rng = sample_rng(seed, epoch, i as u64);
            source
                .with_bytes(i as usize, |bytes| {
                    self.sample(bytes, format, &mut rng, slot)
                })?
                .with_context(|| format!("image {i}"))?;
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crops_fit_the_image() {
        let mut rng = StdRng::seed_from_u64(1);
        for (w, h) in [(256, 256), (512, 300), (40, 500), (1, 1)] {
            for _ in 0..200 {
                let b = random_resized_crop(w, h, &mut rng);
                assert!(b.width >= 1 && b.height >= 1);
                assert!(
                    b.left + b.width <= w && b.top + b.height <= h,
                    "{b:?} in {w}×{h}"
                );
            }
        }
    }

    #[test]
    fn epoch_order_is_a_permutation() {
        let mut o = epoch_order(100, 3, 1);
        assert_ne!(o, epoch_order(100, 3, 2));
        assert_eq!(o, epoch_order(100, 3, 1));
        o.sort();
        assert_eq!(o, (0..100).collect::<Vec<u32>>());
    }
}
