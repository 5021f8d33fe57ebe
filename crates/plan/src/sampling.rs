//! The sampling-parameter uniform, defined once: the word order the runtime
//! writes and the WGSL struct `sample_token` reads both come from
//! [`SamplingUniform::fields`], and the hash that draws its noise from
//! [`PCG`]'s constants.
//!
//! Use: the runtime fills a [`SamplingUniform`] and uploads
//! [`SamplingUniform::to_words`]; codegen declares [`SamplingUniform::wgsl_struct`]
//! and writes its hash with [`pcg_wgsl`]; the CPU sampler hashes with
//! [`pcg`]. The surprise: the two padding words are fields too — a uniform's
//! size is a multiple of 16 bytes, and listing them keeps
//! [`SAMPLING_PARAMS_BYTES`](crate::SAMPLING_PARAMS_BYTES) honest.

/// One 32-bit word of the uniform.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Word {
    /// An unsigned integer.
    U32(u32),
    /// A float.
    F32(f32),
}

impl Word {
    fn bits(self) -> u32 {
        match self {
            Word::U32(v) => v,
            Word::F32(v) => v.to_bits(),
        }
    }

    fn wgsl_type(self) -> &'static str {
        match self {
            Word::U32(_) => "u32",
            Word::F32(_) => "f32",
        }
    }
}

/// What `sample_token` reads: how to choose the next token.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct SamplingUniform {
    /// Seed of the Gumbel noise.
    pub seed: u64,
    /// Temperature; 0 chooses the argmax.
    pub temperature: f32,
    /// Keep the `top_k` largest logits (0: all).
    pub top_k: u32,
    /// Keep the smallest set of probability at least `top_p`.
    pub top_p: f32,
    /// Drop tokens below `min_p` times the largest probability.
    pub min_p: f32,
}

impl SamplingUniform {
    /// The words in uniform order, each with its WGSL field name.
    pub fn fields(&self) -> [(&'static str, Word); 8] {
        [
            ("seed_lo", Word::U32(self.seed as u32)),
            ("seed_hi", Word::U32((self.seed >> 32) as u32)),
            ("temperature", Word::F32(self.temperature)),
            ("top_k", Word::U32(self.top_k)),
            ("top_p", Word::F32(self.top_p)),
            ("min_p", Word::F32(self.min_p)),
            ("pad0", Word::U32(0)),
            ("pad1", Word::U32(0)),
        ]
    }

    /// The bytes to upload, as words.
    pub fn to_words(&self) -> [u32; 8] {
        self.fields().map(|(_, w)| w.bits())
    }

    /// The WGSL declaration of the uniform's struct, `struct Sampling { … }`.
    pub fn wgsl_struct() -> String {
        let fields: Vec<String> = SamplingUniform::default()
            .fields()
            .iter()
            .map(|(name, w)| format!("{name}: {}", w.wgsl_type()))
            .collect();
        format!("struct Sampling {{ {} }}", fields.join(", "))
    }
}

/// The PCG output permutation's constants: state multiplier and increment,
/// output multiplier.
pub const PCG: (u32, u32, u32) = (747_796_405, 2_891_336_453, 277_803_737);

/// One round of the hash the sampler's noise comes from (a PCG output
/// permutation of a running state).
pub fn pcg(v: u32) -> u32 {
    let s = v.wrapping_mul(PCG.0).wrapping_add(PCG.1);
    let w = ((s >> ((s >> 28) + 4)) ^ s).wrapping_mul(PCG.2);
    (w >> 22) ^ w
}

/// [`pcg`] in WGSL, `fn pcg(v: u32) -> u32`.
pub fn pcg_wgsl() -> String {
    format!(
        "fn pcg(v: u32) -> u32 {{\n  let s = v * {}u + {}u;\n  let w = ((s >> ((s >> 28u) + 4u)) ^ s) * {}u;\n  return (w >> 22u) ^ w;\n}}\n",
        PCG.0, PCG.1, PCG.2
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_uniform_fills_its_declared_size() {
        assert_eq!(
            4 * SamplingUniform::default().fields().len() as u64,
            crate::SAMPLING_PARAMS_BYTES
        );
    }

    #[test]
    fn words_follow_the_struct_order() {
        let u = SamplingUniform {
            seed: 0x1234_5678_9abc_def0,
            temperature: 0.5,
            top_k: 40,
            top_p: 0.9,
            min_p: 0.05,
        };
        assert_eq!(
            u.to_words(),
            [
                0x9abc_def0,
                0x1234_5678,
                0.5f32.to_bits(),
                40,
                0.9f32.to_bits(),
                0.05f32.to_bits(),
                0,
                0
            ]
        );
        assert_eq!(
            SamplingUniform::wgsl_struct(),
            "struct Sampling { seed_lo: u32, seed_hi: u32, temperature: f32, top_k: u32, \
             top_p: f32, min_p: f32, pad0: u32, pad1: u32 }"
        );
    }
}
