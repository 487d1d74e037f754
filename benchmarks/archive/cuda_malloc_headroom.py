"""How much free device memory a cudaMalloc leaves unusable: the smallest leftover at which one more reservation
of whole 2 MiB pages succeeds (issue #4: the allocator replay's reservation rule).

Each tensor of 10 MiB or more that finds no cached block is one cudaMalloc of its size rounded up to 2 MiB
(torch's default allocator), and `empty_cache` gives it back. For each case the device is first filled with such
segments (one size), then the largest request of whole 2 MiB pages that succeeds is found, from all that is free
downwards in 2 MiB steps.

    python benchmarks/archive/cuda_malloc_headroom.py [--json FILE]

With PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True the same asks map 20 MiB pages instead; `left_bytes` is then
what was free less the request, not what the mapping left.
"""

from __future__ import annotations

import argparse
import json

import torch

MIB = 1 << 20
PAGE = 2 * MIB


def fits(size_bytes: int) -> bool:
    try:
        tensor = torch.empty(size_bytes, dtype=torch.uint8, device="cuda")
    except torch.OutOfMemoryError:
        return False
    del tensor
    torch.cuda.empty_cache()
    return True


def largest_request(keep_free_bytes: int, filler_bytes: int) -> dict[str, int]:
    """Fill the device with tensors of `filler_bytes` until less than `keep_free_bytes` + `filler_bytes` is free,
    then find the largest request of whole pages that succeeds."""
    fillers = []
    while torch.cuda.mem_get_info()[0] > keep_free_bytes + filler_bytes:
        fillers.append(torch.empty(filler_bytes, dtype=torch.uint8, device="cuda"))
    free_bytes = torch.cuda.mem_get_info()[0]
    reserved_bytes = torch.cuda.memory_reserved()
    request = free_bytes // PAGE * PAGE
    while request > 0 and not fits(request):
        request -= PAGE
    result = {
        "filler_bytes": filler_bytes,
        "fillers": len(fillers),
        "free_bytes": free_bytes,
        "reserved_bytes": reserved_bytes,
        "largest_request_bytes": request,
        "left_bytes": free_bytes - request,
        "free_after_bytes": torch.cuda.mem_get_info()[0],
    }
    del fillers
    torch.cuda.empty_cache()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", help="write the results here too")
    args = parser.parse_args()
    torch.zeros(1, device="cuda")
    torch.cuda.empty_cache()  # nothing reserved but the fillers: torch would release a cached segment at its retry
    results = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "cases": []}
    for keep_free_mib, filler_mib in ((6600, 6552), (200, 6552), (30000, 20), (200, 20), (6600, 1638)):
        case = largest_request(keep_free_mib * MIB, filler_mib * MIB)
        results["cases"].append(case)
        print(
            f"fillers of {filler_mib} MiB x{case['fillers']}: {case['free_bytes'] / MIB:.4f} MiB free, largest "
            f"request {case['largest_request_bytes'] / MIB:.0f} MiB, {case['left_bytes'] / MIB:.4f} MiB left",
            flush=True,
        )
    if args.json:
        with open(args.json, "w") as file:
            json.dump(results, file, indent=1)


if __name__ == "__main__":
    main()
