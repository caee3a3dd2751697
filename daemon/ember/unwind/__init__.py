"""Unwinding without frame pointers: CFI tables built in user space, walked in BPF."""

#: How user stacks are walked (config ``unwinder``, ``ember record --unwinder``),
#: each with what it means.
UNWINDERS: dict[str, str] = {
    "auto": "CFI tables where loaded, frame pointers for code without them; frame "
            "pointers alone if the table walker cannot load on this kernel",
    "dwarf": "as auto, but an error if the table walker cannot load",
    "fp": "frame pointers only (the kernel's own walker)",
}

