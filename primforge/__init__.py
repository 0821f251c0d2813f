"""primforge: custom JAX operators made first-class.

One named primitive, kernels for every backend, every JAX transformation working on it.

    Primitives       register_primitive, defjvp, ETPPrimitive, rule tables, jaxpr walker
    Kernels          XLACustomKernel (+ KernelEntry), use_backend, numba_kernel
    Benchmarking     BenchmarkConfig / BenchmarkRecord / BenchmarkResult, autotune
    Registry         get_kernel, list_kernels, select_kernels
    Runtime          set_cpu_threads (XLA's CPU thread pool), evaluate_once (XLA:CPU fusion),
                     OnlineChoice (the fastest of equivalent chunk calls, while running)
    Sub-packages     primforge.utils (pytree/JAX utilities), primforge.ops (operators),
                     primforge.sim (simulation loops; the COBA network in primforge.sim.coba)
"""

__version__ = "0.1.0"

# The imports follow the layers from the bottom up; the order matters (the benchmarking
# layer needs the kernel layer loaded first), so it is not sorted.
# isort: skip_file

# Primitive core: every rule derived from one implementation; rule slots for interpreters.
from primforge.primitive import (
    ETPPrimitive,
    FrozenDict,
    HashableCallable,
    MissingRuleError,
    defjvp,
    etp_primitives,
    get_etp_rule,
    get_trainable_invars_fn,
    get_x_invar_index,
    get_y_outvar_index,
    is_batched,
    is_etp_primitive,
    is_gradient_enabled,
    per_input_jvp,
    register_primitive,
    static_param,
)
from primforge.rules import RuleTable, iter_rule_eqns, rule_table, rule_tables

# Kernels: one primitive, kernels per backend and platform.
from primforge.kernel.kernel import (
    BackendUnavailableWarning,
    KernelEntry,
    KernelError,
    XLACustomKernel,
)
from primforge.kernel.batching import general_batching_rule
from primforge.kernel.selection import use_backend
from primforge.backends.numba import NumbaKernel, numba_kernel
from primforge.backends.cuda import (
    CompileError,
    FFIModule,
    load_cpp_inline,
    load_cuda_file,
    load_cuda_inline,
)
from primforge.backends.numba_cuda import NumbaCudaKernel, numba_cuda_kernel
from primforge.backends.triton import TritonKernel, triton_kernel
from primforge.backends.warp import WarpKernel, warp_kernel
from primforge.kernel.sharding import ShardingRule, def_sharding_rule

# Benchmarking, registry, autotune.
from primforge.bench import (
    BenchmarkConfig,
    BenchmarkDataFnNotProvidedError,
    BenchmarkMismatchWarning,
    BenchmarkRecord,
    BenchmarkResult,
)
from primforge.registry import get_kernel, list_kernels, select_kernels
from primforge import autotune, debug, utils
from primforge.debug import debug_mode
from primforge.runtime import set_cpu_threads
from primforge.sim import OnlineChoice, evaluate_once

__all__ = [
    "BackendUnavailableWarning",
    "BenchmarkConfig",
    "BenchmarkDataFnNotProvidedError",
    "BenchmarkMismatchWarning",
    "BenchmarkRecord",
    "BenchmarkResult",
    "CompileError",
    "ETPPrimitive",
    "FFIModule",
    "FrozenDict",
    "HashableCallable",
    "KernelEntry",
    "KernelError",
    "MissingRuleError",
    "NumbaCudaKernel",
    "NumbaKernel",
    "OnlineChoice",
    "RuleTable",
    "ShardingRule",
    "TritonKernel",
    "WarpKernel",
    "XLACustomKernel",
    "autotune",
    "debug",
    "debug_mode",
    "def_sharding_rule",
    "defjvp",
    "etp_primitives",
    "evaluate_once",
    "general_batching_rule",
    "get_etp_rule",
    "get_kernel",
    "get_trainable_invars_fn",
    "get_x_invar_index",
    "get_y_outvar_index",
    "is_batched",
    "is_etp_primitive",
    "is_gradient_enabled",
    "iter_rule_eqns",
    "list_kernels",
    "load_cpp_inline",
    "load_cuda_file",
    "load_cuda_inline",
    "numba_cuda_kernel",
    "numba_kernel",
    "per_input_jvp",
    "register_primitive",
    "rule_table",
    "rule_tables",
    "select_kernels",
    "set_cpu_threads",
    "static_param",
    "triton_kernel",
    "use_backend",
    "utils",
    "warp_kernel",
]
