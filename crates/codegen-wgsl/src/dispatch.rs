//! Dispatch assembly: a lowered kernel plus the buffers of its operands
//! becomes a plan [`Dispatch`].
//!
//! The kernel's bindings name IR ports; [`Assembler::dispatch`] asks an
//! operand resolver for the slice behind each port, records the slice's byte
//! size in the kernel's binding declaration (the contract the plan reader
//! checks), and stores each distinct kernel once; [`Assembler::finish`]
//! validates each with naga with exactly the capabilities its variant's
//! features allow (a caller that wants the buffer table alone skips it). A
//! kernel that exceeds the target's workgroup limits is an error here, at
//! compile time.
//!
//! Scratch bindings name no operand: [`Assembler::place_scratch`] puts them
//! all in one scratch buffer once every schedule is built, counters from
//! offset 0 and working memory past the largest counter region, so one
//! kernel's working memory never lands on another kernel's counters.

use crate::kernels::KernelSource;
use crate::target::Limits;
use crate::validate::{capabilities, validate_with};
use crate::CodegenError;
use gerbil_plan::{
    BufferDecl, BufferKind, BufferSlice, Dispatch, Feature, FlopCount, Kernel, KernelOp, Port,
    Requirements, BINDING_OFFSET_ALIGN,
};
use std::collections::HashMap;

/// The distinct kernels of a plan, shared by every schedule and variant.
pub struct Assembler {
    /// Index the scratch buffer will have.
    scratch: u32,
    kernels: Vec<Kernel>,
    /// The features of the variant each kernel belongs to.
    features: Vec<Vec<Feature>>,
    /// Workgroup memory of each kernel, in bytes.
    workgroup_bytes: Vec<u32>,
    index: HashMap<Kernel, u32>,
}

/// Where one IR node's operands live.
pub struct Operands<'a> {
    /// The node's label, for errors and the dispatch.
    pub label: &'a str,
    /// Its transformer layer, if any.
    pub layer: Option<u32>,
    /// The slice bound to a port, if the node has that operand.
    pub slice: &'a dyn Fn(Port) -> Option<BufferSlice>,
    /// The bytes the port's IR value has (at the largest step), worked out
    /// from the IR types independently of where the planner put it.
    pub bytes: &'a dyn Fn(Port) -> Option<u64>,
    /// The node's arithmetic.
    pub flops: FlopCount,
}

/// A node's kernel as [`crate::lower`] made it: the source and what it
/// computes (recorded in the plan for tools).
pub struct Lowered {
    /// The specialized kernel.
    pub source: KernelSource,
    /// What it computes.
    pub op: KernelOp,
}

impl Assembler {
    /// An assembler whose dispatches bind scratch in buffer `scratch` (the
    /// caller declares it with what [`Assembler::place_scratch`] returns).
    pub fn new(scratch: u32) -> Self {
        Assembler {
            scratch,
            kernels: Vec::new(),
            features: Vec::new(),
            workgroup_bytes: Vec::new(),
            index: HashMap::new(),
        }
    }

    /// Turns a lowered kernel into a dispatch over `ops`, for a variant with
    /// `features` on a target with `limits`; `max_t` is the largest step.
    pub fn dispatch(
        &mut self,
        lowered: Lowered,
        ops: &Operands<'_>,
        features: &[Feature],
        limits: &Limits,
        max_t: u32,
    ) -> Result<Dispatch, CodegenError> {
        let Lowered {
            source: mut src,
            op,
        } = lowered;
        check_limits(&src, limits, max_t)?;
        let mut bindings = Vec::with_capacity(src.bindings.len());
        for decl in &mut src.bindings {
            if is_scratch(decl.port) {
                // Offsets are set by `place_scratch`.
                bindings.push(BufferSlice {
                    buffer: self.scratch,
                    offset: 0,
                    size: decl.bytes,
                });
                continue;
            }
            let bug = |what: String| CodegenError::Unsupported {
                label: ops.label.to_string(),
                reason: format!(
                    "kernel {} binding `{}` ({:?}): {what} (a compiler bug)",
                    src.name, decl.name, decl.port
                ),
            };
            let slice =
                (ops.slice)(decl.port).ok_or_else(|| bug("the node has no such operand".into()))?;
            let bytes =
                (ops.bytes)(decl.port).ok_or_else(|| bug("the operand has no size".into()))?;
            if slice.size != bytes {
                return Err(bug(format!(
                    "the planner bound {} bytes to a {bytes}-byte operand",
                    slice.size
                )));
            }
            decl.bytes = bytes;
            bindings.push(slice);
        }
        let workgroups = src.workgroups;
        let kernel = self.kernel(src, op, features);
        Ok(Dispatch {
            kernel,
            bindings,
            workgroups,
            label: ops.label.to_string(),
            layer: ops.layer,
            group: gerbil_ir::without_layers(ops.label),
            flops: ops.flops,
            tokens: None,
        })
    }

    fn kernel(&mut self, src: KernelSource, op: KernelOp, features: &[Feature]) -> u32 {
        let workgroup_bytes = src.workgroup_bytes;
        let mut kernel = Kernel {
            name: src.name,
            wgsl: src.wgsl,
            entry: "main".into(),
            workgroup_size: src.workgroup_size,
            bindings: src.bindings,
            op,
        };
        // A kernel is shared only by variants whose features give the same
        // shader capabilities, so every kernel was validated with exactly
        // the capabilities of its variant.
        let mut key = kernel.clone();
        key.name = format!("{:?}", capabilities(features));
        if let Some(&i) = self.index.get(&key) {
            return i;
        }
        if self.kernels.iter().any(|k| k.name == kernel.name) {
            kernel.name = format!("{}_{}", kernel.name, self.kernels.len());
        }
        let i = self.kernels.len() as u32;
        self.kernels.push(kernel);
        self.features.push(features.to_vec());
        self.workgroup_bytes.push(workgroup_bytes);
        self.index.insert(key, i);
        i
    }

    /// The kernels, by index, each validated by naga with its variant's
    /// capabilities.
    pub fn finish(self) -> Result<Vec<Kernel>, CodegenError> {
        for (kernel, features) in self.kernels.iter().zip(&self.features) {
            validate_with(&kernel.name, &kernel.wgsl, features)?;
        }
        Ok(self.kernels)
    }

    /// Places every scratch binding of `schedules` in the scratch buffer: in
    /// each dispatch, counters packed from offset 0 and working memory packed
    /// from the end of the largest counter region, each at a 256-byte
    /// boundary. Returns the buffer's declaration, or `None` if no dispatch
    /// has scratch.
    pub fn place_scratch(&self, schedules: &mut [&mut Vec<Dispatch>]) -> Option<BufferDecl> {
        let aligned = |bytes: u64| bytes.div_ceil(BINDING_OFFSET_ALIGN) * BINDING_OFFSET_ALIGN;
        let need = |d: &Dispatch, port: Port| -> u64 {
            self.kernels[d.kernel as usize]
                .bindings
                .iter()
                .filter(|b| b.port == port)
                .map(|b| aligned(b.bytes))
                .sum()
        };
        let all = || schedules.iter().flat_map(|s| s.iter());
        let counter_bytes = all().map(|d| need(d, Port::Counters)).max()?;
        let work_bytes = all().map(|d| need(d, Port::Scratch)).max()?;
        if counter_bytes + work_bytes == 0 {
            return None;
        }
        for d in schedules.iter_mut().flat_map(|s| s.iter_mut()) {
            let decls = &self.kernels[d.kernel as usize].bindings;
            let mut next = [0, counter_bytes];
            for (slice, decl) in d.bindings.iter_mut().zip(decls) {
                let region = match decl.port {
                    Port::Counters => 0,
                    Port::Scratch => 1,
                    _ => continue,
                };
                slice.offset = next[region];
                next[region] += aligned(decl.bytes);
            }
        }
        Some(BufferDecl {
            size: (counter_bytes + work_bytes).max(4),
            kind: BufferKind::Scratch { counter_bytes },
        })
    }
}

fn is_scratch(port: Port) -> bool {
    matches!(port, Port::Scratch | Port::Counters)
}

fn check_limits(src: &KernelSource, limits: &Limits, max_t: u32) -> Result<(), CodegenError> {
    for (axis, wg) in src.workgroups.iter().enumerate() {
        let n = wg.eval(max_t);
        if n > limits.max_workgroups_per_dim {
            return Err(CodegenError::Limit {
                what: format!("kernel {} (axis {axis}) at T={max_t}", src.name),
                needed: u64::from(n),
                limit: u64::from(limits.max_workgroups_per_dim),
                limit_name: "max_compute_workgroups_per_dimension",
                hint: "use a smaller --max-tokens-per-step",
            });
        }
    }
    for decl in src.bindings.iter().filter(|b| is_scratch(b.port)) {
        if decl.bytes > limits.max_storage_binding {
            return Err(CodegenError::Limit {
                what: format!("scratch `{}` of kernel {}", decl.name, src.name),
                needed: decl.bytes,
                limit: limits.max_storage_binding,
                limit_name: "max_storage_buffer_binding_size",
                hint: "use a smaller --max-context",
            });
        }
    }
    let invocations: u32 = src.workgroup_size.iter().product();
    for (needed, limit, name) in [
        (
            src.workgroup_bytes,
            limits.max_workgroup_storage,
            "max_compute_workgroup_storage_size",
        ),
        (
            invocations,
            limits.max_invocations,
            "max_compute_invocations_per_workgroup",
        ),
    ] {
        if needed > limit {
            return Err(CodegenError::Limit {
                what: format!("kernel {}", src.name),
                needed: u64::from(needed),
                limit: u64::from(limit),
                limit_name: name,
                hint: "this kernel variant does not fit the target; report it as a compiler bug",
            });
        }
    }
    Ok(())
}

impl Assembler {
    /// The device limits a set of schedules needs (`max_buffer_size` over
    /// the buffers they bind, which are the ones the runtime creates for
    /// them: in a default plan a portable variant does not need the whole
    /// weight only the desktop variants bind).
    pub fn requirements(&self, buffers: &[BufferDecl], schedules: &[&[Dispatch]]) -> Requirements {
        let bound = schedules
            .iter()
            .flat_map(|s| s.iter())
            .flat_map(|d| d.bindings.iter())
            .map(|b| b.buffer as usize);
        let mut r = Requirements {
            max_buffer_size: bound
                .filter_map(|b| buffers.get(b))
                .map(|b| b.size)
                .max()
                .unwrap_or(0),
            ..Requirements::default()
        };
        for d in schedules.iter().flat_map(|s| s.iter()) {
            r = self.add(r, d);
        }
        r
    }

    fn add(&self, mut r: Requirements, d: &Dispatch) -> Requirements {
        let k = &self.kernels[d.kernel as usize];
        r.max_compute_workgroup_storage_size = r
            .max_compute_workgroup_storage_size
            .max(self.workgroup_bytes[d.kernel as usize]);
        r.max_compute_invocations_per_workgroup = r
            .max_compute_invocations_per_workgroup
            .max(k.workgroup_size.iter().product());
        r.max_storage_buffers_per_shader_stage = r
            .max_storage_buffers_per_shader_stage
            .max(k.bindings.len() as u32 - 1);
        for s in d.bindings.iter().skip(1) {
            r.max_storage_buffer_binding_size = r.max_storage_buffer_binding_size.max(s.size);
        }
        r
    }
}
