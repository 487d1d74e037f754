"""A replay of torch's CUDA caching allocator: does a recorded program's allocation sequence fit a GPU?

Whether the largest batch fits is decided by where the allocator puts each block, not by the bytes alone: with
the default allocator, the free pieces of partly used segments (2-5 GiB on the H100 at bert-large's largest
batches) cannot serve a larger request. `replay` runs the requests a real run made (`gpuanat run
--memory-snapshot`, cut down by benchmarks/allocation_trace.py), each one's size scaled to another batch
(`AllocationTemplate`), through the allocator's rules, against the memory the allocator can reserve.

The rules are those of c10/cuda/CUDACachingAllocator.cpp with one stream and no PYTORCH_CUDA_ALLOC_CONF option
but expandable_segments. Requests are rounded up to 512 bytes; up to 1 MiB they come from the small pool, larger
ones from the large pool. The smallest free block of the pool that is large enough serves a request (the lowest
address among equal sizes), split when what remains is at least 512 bytes (small pool) or more than 1 MiB (large
pool), the front handed out; a freed block merges with its free neighbours.
- Default: when no free block fits, a new segment is reserved (cudaMalloc): 2 MiB for the small pool, 20 MiB for
  requests below 10 MiB, else the request rounded up to 2 MiB. A reservation must leave the driver a 2 MiB page
  (`DRIVER_PAGE_BYTES`). When the device has no room for it, every segment
  that is entirely free is released and it is tried once more; then the request runs out of memory.
- Expandable segments: each pool is one segment that maps pages (2 MiB small, 20 MiB large) where it needs them:
  a request no free block fits maps pages at the lowest unmapped address where they, with the free block before
  them, make enough (the end of what is mapped, unless pages were unmapped before). Any free block is split.
  When the device has no room, the whole pages inside free blocks are unmapped and it is tried once more.
  The free block at the end is the last choice for a request other blocks fit.

Pure Python, no torch.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

MIN_BLOCK_BYTES = 512
SMALL_REQUEST_BYTES = 1 << 20
"""Largest request (rounded) served from the small pool."""
SMALL_SEGMENT_BYTES = 2 << 20
"""A small-pool segment; with expandable segments, the small pool's page."""
LARGE_SEGMENT_BYTES = 20 << 20
"""The segment of large requests below `MIN_LARGE_ALLOC_BYTES`; with expandable segments, the large pool's page."""
MIN_LARGE_ALLOC_BYTES = 10 << 20
ROUND_LARGE_BYTES = 2 << 20
DRIVER_PAGE_BYTES = 2 << 20
"""What a reservation must leave free: the driver may take a 2 MiB page of its own for it. On the H100
(benchmarks/results/h100/allocator/headroom/), filled with segments, a cudaMalloc or a page mapping that would have
left 0.19 MiB free was refused in all 10 tries, and a cudaMalloc leaving 2.19 MiB was granted in all 5. At batch 819
of fp32 + checkpointing, runs asked for 6552 MiB with 6552.19 MiB free and ran out of memory
(allocator/edge_traces/)."""
EXPANDABLE_ADDRESS_SPACE_BYTES = 1 << 50
"""Virtual address space of an expandable segment: more than any device has."""


def round_size(size: int) -> int:
    return max(MIN_BLOCK_BYTES, -(-size // MIN_BLOCK_BYTES) * MIN_BLOCK_BYTES)


def segment_size(rounded: int) -> int:
    """What the default allocator reserves for a request of `rounded` bytes that no free block fits."""
    if rounded <= SMALL_REQUEST_BYTES:
        return SMALL_SEGMENT_BYTES
    if rounded < MIN_LARGE_ALLOC_BYTES:
        return LARGE_SEGMENT_BYTES
    return -(-rounded // ROUND_LARGE_BYTES) * ROUND_LARGE_BYTES


@dataclass(eq=False)
class Block:
    address: int
    size: int
    small: bool
    allocated: bool = False
    mapped: bool = True
    prev: Block | None = None
    next: Block | None = None


class OutOfMemory(Exception):
    def __init__(self, request_index: int, size: int, reserved_bytes: int, allocated_bytes: int) -> None:
        super().__init__(
            f"request {request_index}: {size} bytes, with {allocated_bytes} allocated of {reserved_bytes} reserved"
        )
        self.request_index, self.size = request_index, size
        self.reserved_bytes, self.allocated_bytes = reserved_bytes, allocated_bytes


class _FreeBlocks:
    """A pool's free (mapped) blocks ordered by (size, address): the best fit is a bisection away."""

    def __init__(self) -> None:
        self._keys: list[tuple[int, int]] = []
        self._blocks: dict[tuple[int, int], Block] = {}

    def add(self, block: Block) -> None:
        key = (block.size, block.address)
        bisect.insort(self._keys, key)
        self._blocks[key] = block

    def remove(self, block: Block) -> None:
        key = (block.size, block.address)
        del self._keys[bisect.bisect_left(self._keys, key)]
        del self._blocks[key]

    def at_least(self, size: int) -> Iterable[Block]:
        """Free blocks of `size` bytes or more, smallest first."""
        for index in range(bisect.bisect_left(self._keys, (size, -1)), len(self._keys)):
            yield self._blocks[self._keys[index]]

    def __iter__(self) -> Iterator[Block]:
        """A copy, by (size, address): the set may change while it is walked."""
        return iter([self._blocks[key] for key in self._keys])


def _link(before: Block | None, block: Block, after: Block | None) -> None:
    block.prev, block.next = before, after
    if before is not None:
        before.next = block
    if after is not None:
        after.prev = block


def _absorb(block: Block, neighbour: Block) -> None:
    """Merge `neighbour` (`block.prev` or `block.next`) into `block`."""
    if neighbour is block.prev:
        block.address = neighbour.address
        _link(neighbour.prev, block, block.next)
    else:
        _link(block.prev, block, neighbour.next)
    block.size += neighbour.size


class CachingAllocator:
    """torch's caching allocator on one stream, on a device where it can reserve `capacity_bytes` in all."""

    def __init__(self, capacity_bytes: int, *, expandable_segments: bool = False) -> None:
        self.capacity_bytes = capacity_bytes
        self.expandable_segments = expandable_segments
        self.free_blocks = {True: _FreeBlocks(), False: _FreeBlocks()}
        self.reserved_bytes = self.allocated_bytes = 0
        self.peak_reserved_bytes = self.peak_allocated_bytes = 0
        self.reservations: list[int] = []
        """Bytes of every segment reserved (default) or range mapped (expandable segments), in order."""
        self.least_left_bytes = capacity_bytes
        """The least the device had left for the allocator after any of its reservations."""
        self._lowest_address = 1 << 62
        """cudaMalloc hands out lower addresses as the device fills (seen on the H100): the newest segment is the
        lowest, and so the first choice among equal free blocks."""
        self._unmapped: dict[bool, list[Block]] = {}
        """With expandable segments: per pool, its segment's unmapped blocks by address (`_unmapped_blocks`)."""

    # --- reserving device memory ---

    def _reserve(self, size: int) -> bool:
        if self.reserved_bytes + size > self.capacity_bytes - DRIVER_PAGE_BYTES:
            return False
        self.reserved_bytes += size
        self.peak_reserved_bytes = max(self.peak_reserved_bytes, self.reserved_bytes)
        self.least_left_bytes = min(self.least_left_bytes, self.capacity_bytes - self.reserved_bytes)
        self.reservations.append(size)
        return True

    def _new_segment(self, rounded: int, small: bool) -> Block | None:
        size = segment_size(rounded)
        if not self._reserve(size):
            return None
        self._lowest_address -= size + ROUND_LARGE_BYTES  # segments are not contiguous: they never merge
        return Block(self._lowest_address, size, small)

    def _release_cached(self) -> None:
        """What torch does before its last try: release every free segment (default), or unmap the whole pages
        inside free blocks (expandable segments)."""
        for small, free in self.free_blocks.items():
            for block in free:  # a copy: releasing changes the set
                if not self.expandable_segments:
                    if block.prev is None and block.next is None:
                        free.remove(block)
                        self.reserved_bytes -= block.size
                    continue
                self._unmap_pages(block, small)

    # --- expandable segments ---

    def _page(self, small: bool) -> int:
        return SMALL_SEGMENT_BYTES if small else LARGE_SEGMENT_BYTES

    def _unmapped_blocks(self, small: bool) -> list[Block]:
        """The pool's unmapped blocks by address: holes that were unmapped, then the rest of its address space."""
        if small not in self._unmapped:
            # The segment starts on a page of either pool (20 MiB is a multiple of 2 MiB).
            self._lowest_address = (
                (self._lowest_address - 2 * EXPANDABLE_ADDRESS_SPACE_BYTES) // LARGE_SEGMENT_BYTES * LARGE_SEGMENT_BYTES
            )
            self._unmapped[small] = [Block(self._lowest_address, EXPANDABLE_ADDRESS_SPACE_BYTES, small, mapped=False)]
        return self._unmapped[small]

    def _is_frontier(self, block: Block) -> bool:
        return block.next is not None and not block.next.mapped

    def _unmap_pages(self, block: Block, small: bool) -> None:
        page = self._page(small)
        start = -(-block.address // page) * page
        end = (block.address + block.size) // page * page
        if end <= start:
            return
        self.free_blocks[small].remove(block)
        before, after = block.prev, block.next
        pieces = [Block(block.address, start - block.address, small)] if start > block.address else []
        hole = Block(start, end - start, small, mapped=False)
        pieces.append(hole)
        if block.address + block.size > end:
            pieces.append(Block(end, block.address + block.size - end, small))
        for piece in pieces:
            _link(before, piece, after)
            before = piece
            if piece.mapped:
                self.free_blocks[small].add(piece)
        self.reserved_bytes -= end - start
        unmapped = self._unmapped_blocks(small)
        for neighbour in (hole.prev, hole.next):
            if neighbour is not None and not neighbour.mapped:
                unmapped.remove(neighbour)
                _absorb(hole, neighbour)
        bisect.insort(unmapped, hole, key=lambda block: block.address)

    def _absorb_free_neighbours(self, block: Block) -> None:
        """Merge the free mapped blocks on either side into `block` (they leave the free set; `block` is not in it)."""
        for neighbour in (block.prev, block.next):
            if neighbour is not None and neighbour.mapped and not neighbour.allocated:
                self.free_blocks[block.small].remove(neighbour)
                _absorb(block, neighbour)

    def _map(self, unmapped: Block, size: int, small: bool) -> Block:
        """Map the first `size` bytes of `unmapped` (whole pages); the free block they join."""
        block = Block(unmapped.address, size, small)
        unmapped.address += size
        unmapped.size -= size
        if unmapped.size == 0:
            self._unmapped[small].remove(unmapped)
            _link(unmapped.prev, block, unmapped.next)
        else:
            _link(unmapped.prev, block, unmapped)
        self._absorb_free_neighbours(block)
        return block

    def _extend(self, rounded: int, small: bool) -> Block | None:
        """Map pages so that a free block of `rounded` bytes exists: at the lowest unmapped address where the free
        and unmapped blocks from there (or from the free block before it) add up to enough."""
        for unmapped in self._unmapped_blocks(small):
            before = unmapped.prev
            start = before if before is not None and before.mapped and not before.allocated else unmapped
            total = 0
            walker: Block | None = start
            while walker is not None and not walker.allocated and total < rounded:
                total, walker = total + walker.size, walker.next
            if total >= rounded:
                break
        else:
            return None
        page = self._page(small)
        free = self.free_blocks[small]
        block = start if start.mapped else None
        in_free = block is not None
        while block is None or block.size < rounded:
            target = block.next if block is not None else start
            assert target is not None and not target.mapped, "the free and unmapped blocks found were not enough"
            have = block.size if block is not None else 0
            size = min(-(-(rounded - have) // page) * page, target.size)
            if block is not None and not in_free:
                free.add(block)  # what is mapped stays mapped; _map merges it with the new pages
                in_free = True
            if not self._reserve(size):
                return None
            block, in_free = self._map(target, size, small), False
        if in_free:
            free.remove(block)
        return block

    def _best_fit(self, rounded: int, small: bool) -> Block | None:
        blocks = iter(self.free_blocks[small].at_least(rounded))
        best = next(blocks, None)
        if best is not None and self.expandable_segments and self._is_frontier(best):
            # Before unmapped pages, a block counts as the size it can grow to: the last choice.
            best = next(blocks, best)
        return best

    # --- the allocator's interface ---

    def malloc(self, size: int, request_index: int = -1) -> Block:
        rounded = round_size(size)
        small = rounded <= SMALL_REQUEST_BYTES
        free = self.free_blocks[small]
        block = self._best_fit(rounded, small)
        if block is not None:
            free.remove(block)
        else:
            grow = self._extend if self.expandable_segments else self._new_segment
            block = grow(rounded, small)
            if block is None:
                self._release_cached()
                block = grow(rounded, small)
            if block is None:
                raise OutOfMemory(request_index, rounded, self.reserved_bytes, self.allocated_bytes)
        remaining = block.size - rounded
        if remaining >= MIN_BLOCK_BYTES if small or self.expandable_segments else remaining > SMALL_REQUEST_BYTES:
            rest = Block(block.address + rounded, remaining, small)
            _link(block, rest, block.next)
            block.size = rounded
            free.add(rest)
        block.allocated = True
        self.allocated_bytes += block.size
        self.peak_allocated_bytes = max(self.peak_allocated_bytes, self.allocated_bytes)
        return block

    def free(self, block: Block) -> None:
        block.allocated = False
        self.allocated_bytes -= block.size
        self._absorb_free_neighbours(block)
        self.free_blocks[block.small].add(block)


# --- recorded requests and their replay ---

FREE_ACTION = "free_completed"
"""The trace's event at which a block is the allocator's again (after `free_requested`, once its streams are done)."""


@dataclass(frozen=True)
class Requests:
    """The allocation requests of a recorded run, in order."""

    operations: tuple[int, ...]
    """-1: the next allocation (of `sizes`); k >= 0: free allocation k."""
    sizes: tuple[int, ...]
    """Bytes asked for by each allocation."""


def requests_of(events: Iterable[list[Any]]) -> Requests:
    """The requests of a trace's events, [action, address, size, stream] as benchmarks/allocation_trace.py writes
    them from torch's snapshot (`device_traces`): allocations and the frees that give their blocks back."""
    operations: list[int] = []
    sizes: list[int] = []
    live: dict[int, int] = {}
    for action, address, size, _stream in events:
        if action == "alloc":
            live[address] = len(sizes)
            sizes.append(size)
            operations.append(-1)
        elif action == FREE_ACTION and address in live:
            operations.append(live.pop(address))
    return Requests(tuple(operations), tuple(sizes))


@dataclass(frozen=True)
class Replay:
    fits: bool
    out_of_memory: OutOfMemory | None
    peak_allocated_bytes: int
    peak_reserved_bytes: int
    reservations: tuple[int, ...]
    least_left_bytes: int
    """The least the device had left after any reservation: how near the replay came to running out."""


def replay(
    operations: Iterable[int],
    sizes: list[int] | tuple[int, ...],
    capacity_bytes: int,
    *,
    expandable_segments: bool = False,
) -> Replay:
    """Run the requests through a `CachingAllocator` that can reserve `capacity_bytes`."""
    allocator = CachingAllocator(capacity_bytes, expandable_segments=expandable_segments)
    blocks: list[Block | None] = []
    out_of_memory = None
    try:
        for operation in operations:
            if operation < 0:
                blocks.append(allocator.malloc(sizes[len(blocks)], len(blocks)))
            else:
                allocator.free(blocks[operation])  # type: ignore[arg-type]
                blocks[operation] = None
    except OutOfMemory as error:
        out_of_memory = error
    return Replay(
        fits=out_of_memory is None,
        out_of_memory=out_of_memory,
        peak_allocated_bytes=allocator.peak_allocated_bytes,
        peak_reserved_bytes=allocator.peak_reserved_bytes,
        reservations=tuple(allocator.reservations),
        least_left_bytes=allocator.least_left_bytes,
    )


@dataclass(frozen=True)
class AllocationTemplate:
    """A recorded program's requests with each allocation's size a line in the batch size, from runs recorded at
    several batch sizes: the same requests in the same order, only their sizes differ."""

    operations: tuple[int, ...]
    base_bytes: tuple[float, ...]
    """Each allocation's size extrapolated to no samples."""
    per_sample_bytes: tuple[float, ...]
    recorded_batch_sizes: tuple[int, ...]

    def sizes(self, batch_size: int) -> list[int]:
        return [
            max(1, round(base + per_sample * batch_size))
            for base, per_sample in zip(self.base_bytes, self.per_sample_bytes, strict=True)
        ]

    def replay(self, batch_size: int, capacity_bytes: int, *, expandable_segments: bool = False) -> Replay:
        return replay(self.operations, self.sizes(batch_size), capacity_bytes, expandable_segments=expandable_segments)


class TemplateError(ValueError):
    """Recorded runs that do not make one template: their requests differ by more than their sizes."""


def build_template(recorded: dict[int, Requests]) -> AllocationTemplate:
    """The template of runs recorded at two or more batch sizes ({batch size: requests}): each size the line
    through the two largest batches. Nearly all sizes are lines through all of them; the few that are not level
    off (on the H100, a workspace per layer of 128 MiB at batch 8 and 132 MiB from batch 12 up), and the largest
    batches say where they go. The requests' order is the largest batch's: within a run of frees with no
    allocation between them Python may free in another order, which leaves the allocator in the same state."""
    if len(recorded) < 2:
        raise TemplateError("a template needs runs at two batch sizes or more")
    batches = sorted(recorded)
    counts = {batch: len(recorded[batch].sizes) for batch in batches}
    if len(set(counts.values())) != 1:
        raise TemplateError(f"the runs made different numbers of allocations: {counts}")
    low, high = batches[-2:]
    per_sample = tuple(
        (large - small) / (high - low) for small, large in zip(recorded[low].sizes, recorded[high].sizes, strict=True)
    )
    base = tuple(size - slope * high for size, slope in zip(recorded[high].sizes, per_sample, strict=True))
    return AllocationTemplate(
        operations=recorded[high].operations,
        base_bytes=base,
        per_sample_bytes=per_sample,
        recorded_batch_sizes=tuple(batches),
    )
