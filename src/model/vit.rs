//! Vision Transformer (ViT): the encoder of [`super::transformer`] over image patches.
//!
//! The image `(B, C, I, I)` is cut into `N = (I/p)²` patches of `p × p` pixels (unfold: a
//! reshape to `(B, C, I/p, p, I/p, p)`, a permute and a copying reshape to `(B, N, C·p²)`),
//! each projected to the hidden size by a linear layer (`patch`, the same map as a stride-`p`
//! convolution); a learned class token is put in front and learned position embeddings (`wpe`,
//! `N + 1` rows) are added, so the encoder's sequence is `S = N + 1`. The `L` pre-LayerNorm
//! blocks are the decoder's without the causal mask; the final LayerNorm and the classifier
//! (`head`, with bias) see the class token only, and the loss is the cross-entropy over the
//! `K` classes.
//!
//! Shapes: images `(B, C, I, I)` → patches `(B, N, C·p²)` → `(B, N, H)` → with the class
//! token `(B, S, H)` → blocks `(B, S, H)` → class token `(B, 1, H)` → logits `(B, 1, K)`
//! (kept 3-dimensional, so the decoder's loss applies with targets `(B, 1)`).
//!
//! Parameters (exact): `P = C·p²·H + H (patch) + H (class token) + S·H (positions)
//! + L·(12·H² + 13·H) + 2·H (final LayerNorm) + K·H + K (classifier)`.
//!
//! ```no_run
//! use candle_core::{DType, Device};
//! use candle_nn::{VarBuilder, VarMap};
//! use memfit::model::transformer::{Config, Transformer};
//! use memfit::model::vit;
//! let cfg = Config::preset("vit-tiny").unwrap();
//! let varmap = VarMap::new();
//! let vb = VarBuilder::from_varmap(&varmap, DType::F32, &Device::Cpu);
//! let model = Transformer::new(&cfg, vb).unwrap();
//! let vision = cfg.vision.unwrap();
//! let (images, targets) = vit::synthetic_batch(2, vision, cfg.vocab, &Device::Cpu).unwrap();
//! let logits = model.forward(&images).unwrap(); // (2, 1, classes)
//! ```

pub use super::shapes::{Sizes, Vision};
use super::tensor_ops::TensorOps;
use candle_core::{Device, Result, Tensor};

/// Names of the ViT presets (also accepted by `transformer::Config::preset`).
pub const PRESETS: &[&str] = &["vit-tiny", "vit-s16", "vit-b16", "vit-l16"];

/// The presets: `vit-tiny` (test-sized: 32 px, patch 8, H 96, A 3, L 2, 10 classes) and
/// ViT-S/16, ViT-B/16, ViT-L/16 at 224 px with 1000 classes (Dosovitskiy et al. 2021's sizes).
pub fn preset(name: &str) -> Option<Sizes> {
    let at224 = Vision {
        image: 224,
        patch: 16,
        channels: 3,
    };
    let sizes = |vision, classes, hidden, heads, layers| Sizes {
        vision,
        classes,
        hidden,
        heads,
        layers,
    };
    match name {
        "vit-tiny" => {
            let tiny = Vision {
                image: 32,
                patch: 8,
                channels: 3,
            };
            Some(sizes(tiny, 10, 96, 3, 2))
        }
        "vit-s16" => Some(sizes(at224, 1000, 384, 6, 12)),
        "vit-b16" => Some(sizes(at224, 1000, 768, 12, 12)),
        "vit-l16" => Some(sizes(at224, 1000, 1024, 16, 24)),
        _ => None,
    }
}

/// Unfold `images (B, C, I, I)` into patches `(B, N, C·p²)`, row-major over the patch grid,
/// each patch's values channel-major (a copy: the permuted view is not contiguous).
pub fn patchify<T: TensorOps>(images: &T, patch: usize) -> Result<T> {
    let d = images.dims();
    let (b, c, nh, nw) = (d[0], d[1], d[2] / patch, d[3] / patch);
    images
        .reshape(&[b, c, nh, patch, nw, patch])?
        .permute(&[0, 2, 4, 1, 3, 5])?
        .reshape(&[b, nh * nw, c * patch * patch])
}

/// Deterministic synthetic batch: images `(B, C, I, I)` f32 in `[-1, 1)` and class targets
/// `(B, 1)` u32 in `0..classes`.
pub fn synthetic_batch(
    batch: usize,
    v: Vision,
    classes: usize,
    device: &Device,
) -> Result<(Tensor, Tensor)> {
    let mut state: u64 = 0x2545_F491_4F6C_DD1D;
    let mut next = || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let n = batch * v.channels * v.image * v.image;
    let pixels: Vec<f32> = (0..n)
        .map(|_| (next() >> 40) as f32 / (1u64 << 23) as f32 - 1.0)
        .collect();
    let targets: Vec<u32> = (0..batch)
        .map(|_| (next() % classes as u64) as u32)
        .collect();
    Ok((
        Tensor::from_vec(pixels, (batch, v.channels, v.image, v.image), device)?,
        Tensor::from_vec(targets, (batch, 1), device)?,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Patch (1, 1) of a 4×4 two-channel image with 2×2 patches holds rows 2–3, columns 2–3 of
    /// channel 0, then of channel 1.
    #[test]
    fn patchify_orders_patches_and_channels() {
        let x: Vec<f32> = (0..32).map(|i| i as f32).collect();
        let images = Tensor::from_vec(x, (1, 2, 4, 4), &Device::Cpu).unwrap();
        let p = patchify(&images, 2).unwrap();
        assert_eq!(p.dims(), &[1, 4, 8]);
        let last: Vec<f32> = p.get(0).unwrap().get(3).unwrap().to_vec1().unwrap();
        assert_eq!(last, vec![10., 11., 14., 15., 26., 27., 30., 31.]);
    }

    #[test]
    fn every_preset_name_has_sizes() {
        let b16 = preset("vit-b16").unwrap();
        assert_eq!(b16.vision.seq(), 197);
        assert_eq!(b16.vision.patch_dim(), 768);
        for name in PRESETS {
            assert!(preset(name).is_some(), "{name}");
        }
    }
}
