"""ember's errors, one hierarchy. Every class has a stable ``label`` used as the
``reason`` label of the error metrics, so each failure kind is countable.

    EmberError                      label
    ├── UsageError                  usage          bad arguments or config (exit 2)
    │   └── ConfigError             config
    ├── EnvironmentProblem          environment    the host cannot run ember (exit 2)
    │   ├── PrivilegeError          privilege      a capability is missing
    │   ├── KernelHeadersError      headers        bcc finds no kernel headers
    │   ├── TracefsError            tracefs        tracefs is not mounted
    │   └── BccMissingError         bcc            python3-bpfcc is not importable
    ├── BpfError                    bpf            compiling, loading or attaching failed
    ├── ProcessGone                 process_gone   a process exited before we read it
    ├── SymbolizationError          symbolization  an object could not be read
    │   ├── ElfError                elf            malformed or unreadable ELF
    │   ├── DwarfError              dwarf          no, malformed or unreadable DWARF
    │   └── UnwindTableError        unwind         no, malformed or unusable CFI (.eh_frame)
    ├── OutputError                 output         the output cannot be written (exit 2)
    ├── ExportError                 export         a backend refused or could not be reached
    │   └── KubernetesError         kubernetes     the API server's pod list/watch failed
    └── StorageError                storage        the collector's store cannot write
        └── StorageFull             storage_full   its disk is full (writes refused, retryable)

Only the CLI turns these into messages and exit statuses; library code raises
them and never prints.
"""

from __future__ import annotations


class EmberError(Exception):
    label = "error"
    exit_status = 1


class UsageError(EmberError):
    label = "usage"
    exit_status = 2


class ConfigError(UsageError):
    label = "config"


class EnvironmentProblem(EmberError):
    label = "environment"
    exit_status = 2


class PrivilegeError(EnvironmentProblem):
    label = "privilege"


class KernelHeadersError(EnvironmentProblem):
    label = "headers"


class TracefsError(EnvironmentProblem):
    label = "tracefs"


class BccMissingError(EnvironmentProblem):
    label = "bcc"


class BpfError(EmberError):
    label = "bpf"


class ProcessGone(EmberError):
    label = "process_gone"


class SymbolizationError(EmberError):
    label = "symbolization"


class ElfError(SymbolizationError):
    label = "elf"


class DwarfError(SymbolizationError):
    label = "dwarf"


class UnwindTableError(SymbolizationError):
    label = "unwind"


class OutputError(EmberError):
    label = "output"
    exit_status = 2


class ExportError(EmberError):
    label = "export"


class KubernetesError(ExportError):
    label = "kubernetes"


class StorageError(EmberError):
    label = "storage"


class StorageFull(StorageError):
    label = "storage_full"


ALL_ERRORS: tuple[type[EmberError], ...] = (
    EmberError,
    UsageError,
    ConfigError,
    EnvironmentProblem,
    PrivilegeError,
    KernelHeadersError,
    TracefsError,
    BccMissingError,
    BpfError,
    ProcessGone,
    SymbolizationError,
    ElfError,
    UnwindTableError,
    OutputError,
    ExportError,
    KubernetesError,
    StorageError,
    StorageFull,
)
