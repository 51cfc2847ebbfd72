"""kiln's thread pool, as LLVM IR: ``kiln_parallel_for``, which every parallel loop calls.

    void kiln_parallel_for(void (*chunk)(i8 *data, i64 lo, i64 hi), i8 *data, i64 n, i64 grain)

runs ``chunk`` over ``[0, n)`` in chunks of ``grain`` iterations (the last one shorter) and
returns when every chunk has run. The iterations of a chunk run in order on one thread; the
chunks run on any thread in any order, so the caller's iterations must be independent.

How. The pool has up to ``kiln_num_threads - 1`` worker threads, created by
``pthread_create`` the first time a region wants them. A region publishes its job (the
function, its data, n, grain) and bumps the job word; then the caller, like every worker that
joins, claims chunk after chunk with an atomic fetch-add until none is left, and waits only
for chunks already claimed. A worker that is descheduled, or busy elsewhere, never holds up
a region it has not joined: the caller runs its share. That is the difference from a static
split (thread t gets the t-th contiguous share), where one descheduled thread stalls the
region for a scheduler tick.

Whose chunks. The chunks are cut into one contiguous range per participant — the caller's
first, then one per helper in the order they join — each with its own counter (a cache line
apiece). A thread claims from its own range, then from what is left of the others'. So from
call to call a thread runs the same chunks whenever the threads keep pace, and its core's
caches keep their data: a batch-1 dense whose weight is split over two L2s finds its half
there at the next call. With one shared counter the split moved from call to call (the batch-1
MLP 784-512-512-10 of benchmarks/peers.py: 19.2 → 16.2 µs a call back to back, 32.7 → 28.4 in
peers' pattern, four processes of each alternated on the 2-core Emerald Rapids VM; the LSTMs
and the batch-64 MLP within the noise).

Waiting. An idle worker spins on the job word for a while — ``WORKER_PAUSE_SPINS`` checks
with the target's pause instruction (``llvm.x86.sse2.pause`` on x86, nothing elsewhere), then
checks with ``sched_yield`` up to ``WORKER_SPINS`` — so that the next region of a loop of
small kernels finds it awake without it taking a core another thread wants; then, unless
``kiln_pool_spin_ns`` asks it to go on yielding for that long since its last region
(``KILN_SPIN_MS``; 0 by default), it sleeps on a pthread condition variable, and the caller
signals it only when some worker sleeps. Where a yield kept it off its core for long
(`YIELD_LOST_NS`), another thread wants that core on and on, and a worker that goes on
yielding to it joins the next region only after that thread's timeslice, while a woken one
runs first: for the next `CROWDED_NS` the worker sleeps after `CROWDED_PAUSE_SPINS` pause
checks, without yielding (also where ``kiln_pool_spin_ns`` asks it to stay awake).
The caller, waiting for claimed chunks to finish, spins briefly and then yields its core
with ``sched_yield``.

Where a sleeping worker wakes. Before it wakes sleeping workers, the caller (`pool.steer`)
lets each of them run on one CPU only: the next one the caller may use after the last one
given, never the caller's own. Once awake, a worker frees its affinity again (to the CPUs
it was created with). A scheduler may otherwise wake a worker on its waker's CPU, where it
waits behind the caller while the caller runs every chunk: the guest kernel of the
Sapphire Rapids-class VM this was measured on packs woken threads onto busy vCPUs, and a
parallel kernel called after 50 ms of idleness ran at one thread's speed for its next
calls (a 256 → 512 channel stride-2 convolution, 2 threads: 0.82 ms a call against 0.85
on one thread; steered, 0.50; its 64-channel 56² 3×3: 1.31 → 0.70).

The job word. Odd while a job is open, even when closed; it only grows, so a worker never
mistakes a new job for the one it finished. A worker joins by incrementing ``active`` and
then checking that the job word is still the one it saw; the caller closes the job (bumps
the word to even) once every chunk has run, and returns. The next region's caller publishes
its job only if ``active`` is 0; otherwise a worker is still inside the old job (joined, or
leaving, without a chunk to run: a worker descheduled in that window used to hold the caller
for a scheduler timeslice after all the work was done) and the region runs on the caller
alone. With sequentially consistent accesses to both words, a worker either sees the close
and leaves without reading the job, or the next caller sees the worker and does not publish:
no worker ever reads a half-written job or claims a chunk of the wrong one.

Several callers. One region at a time owns the pool (a try-lock); a caller that finds it
taken (another Python thread calling a kernel, or a nested region, which the loop verifier
forbids anyway) runs all its chunks itself: the same iterations, so the same results.

Portability. The pool uses only pthread_create/detach, pthread_mutex_*/pthread_cond_* and
sched_yield from libc, and on Linux (glibc, musl) sched_getcpu, sched_getaffinity and
pthread_{get,set}affinity_np to steer woken workers; elsewhere they wake where the
scheduler puts them. The mutex and condition variable live in generously sized, aligned
storage (``SYNC_BYTES``: glibc's are 40-48 bytes on every 64-bit target) initialised with
``pthread_*_init``, so nothing depends on one architecture's struct layout or syscall
numbers. The same text is compiled into this process at start-up (threads.py) and into every
exported library that has a parallel loop, for that library's target (export_objects.py).
"""

from __future__ import annotations

from kiln.codegen.outline import NUM_THREADS_SYMBOL, PARALLEL_FOR_SYMBOL

# Checks of the job word an idle worker makes before it sleeps: the first WORKER_PAUSE_SPINS
# each followed by a pause (~30 ns on the 2-core EPYC dev machine: 0.25 ms), the rest by
# sched_yield (a few ms when no other thread wants the core). Waking a sleeping worker costs
# far more in a VM (its vCPU halts): sleeping after 0.25 ms, a batch-64 MLP called every 2 ms
# took 1.0 ms instead of 0.46. Pausing for 2 ms instead fixed that but fought OpenBLAS's
# spinning threads right after a numpy call (5.7x the MLP's solo time); yielding keeps the
# worker awake without taking the core from a thread that wants it.
WORKER_PAUSE_SPINS = 8192
WORKER_SPINS = WORKER_PAUSE_SPINS + 8192
# Nanoseconds a worker's sched_yield may take before the worker sleeps instead: longer means
# another thread ran meanwhile and will run again (a spinning thread of another library, a
# busy process), and a yielding worker then waits behind it each time a region opens — a
# woken one is run ahead of it. Right after a numpy call OpenBLAS's idle worker spins on the
# other core for 0.1 s; the batch-64 MLP ran at one thread's speed there (1.8-2.0 times its
# time alone; sleeping at once, 1.0-1.2). A yield no thread takes returns in about a µs; a
# spinning thread keeps the core for a scheduler slice (0.75 ms and up).
YIELD_LOST_NS = 20_000
# Nanoseconds after such a yield during which a worker sleeps as soon as its pause checks
# are done, without yielding: a yielding worker, even one that yields only a few times before
# it sleeps, still ran behind OpenBLAS's spinning thread (1.8 times), one that went to sleep
# straight from its pause checks did not (1.1). OpenBLAS's threads spin for 0.1 s after a call.
CROWDED_NS = 100_000_000
# Pause checks a worker makes in that time before it sleeps (about 30 µs): enough for the
# gaps between the regions of one call and between calls back to back; pausing for all of
# WORKER_PAUSE_SPINS took the core from the thread that shares it for 0.3 ms after every
# region (torch's MLP called right after kiln's: 1.3 times its time alone).
CROWDED_PAUSE_SPINS = 1024
# Checks a waiting caller makes before it starts yielding its core on each further check.
CALLER_SPINS = 1024
# Nanoseconds an idle worker goes on yield-spinning after WORKER_SPINS, counted from the end
# of its last region, before it sleeps: 0 by default. In a VM a worker that slept wakes on a
# halted vCPU that comes back slowly: after 50 ms idle, a batch-64 MLP ran its next calls at
# one thread's speed (0.52 ms against 0.30), and with the workers kept awake for 0.1 s at
# ORT's (0.33; ORT's own workers spin by default) — at the price of a core kept busy
# yielding. Set per process with KILN_SPIN_MS or kiln.codegen.set_spin_ms (threads.py).
SPIN_NS_SYMBOL = "kiln_pool_spin_ns"
# Worker threads the pool creates at most (kiln_num_threads beyond this + 1 are not used).
MAX_WORKERS = 255
# ``i32 kiln_fp_update(i32 keep, i32 set)``: this thread's floating-point control word
# (MXCSR on x86) becomes ``(old & keep) | set`` in one step, and ``old`` is returned;
# elsewhere it does nothing and returns 0 (threads.py `flush_denormals`). A parallel
# region's workers run its chunks in its caller's mode.
FP_UPDATE_SYMBOL = "kiln_fp_update"
# Bytes of a cpu_set_t (glibc's and musl's: 1024 CPUs). A machine with more CPUs makes the
# affinity calls fail, and the workers are then left where the scheduler wakes them.
CPU_SET_BYTES = 128
# Bytes reserved for a pthread_mutex_t and for a pthread_cond_t (glibc: 40 and 48 on x86-64,
# 48 and 48 on aarch64), aligned to 16.
SYNC_BYTES = 128


def _pause(triple: str) -> tuple[str, str]:
    """The call of the target's spin-wait hint, and its declaration ('' where it has none)."""
    arch = triple.split("-")[0]
    if arch in ("x86_64", "i386", "i686"):
        return ("call void @llvm.x86.sse2.pause()", "declare void @llvm.x86.sse2.pause()")
    return ("", "")


def _fp_mode(triple: str) -> dict[str, str]:
    """The IR that reads and sets the thread's floating-point control word (x86's MXCSR:
    flush-to-zero and denormals-are-zero among its bits), or nothing where the pool does not
    carry it over: the template's ``fp_*`` pieces."""
    arch = triple.split("-")[0]
    if arch not in ("x86_64", "i386", "i686"):
        return {"fp_decl": "", "fp_publish": "", "fp_enter": "", "fp_leave": "",
                "fp_update": "  ret i32 0"}
    return {
        "fp_decl": "declare void @llvm.x86.sse.stmxcsr(ptr)\n"
                   "declare void @llvm.x86.sse.ldmxcsr(ptr)",
        # the caller's mode, for the workers that join its job
        "fp_publish": "  call void @llvm.x86.sse.stmxcsr(ptr @pool.fpmode)",
        # a worker runs the job's chunks in the caller's mode, then goes back to its own
        "fp_enter": "  call void @llvm.x86.sse.stmxcsr(ptr %own)\n"
                    "  call void @llvm.x86.sse.ldmxcsr(ptr @pool.fpmode)",
        "fp_leave": "  call void @llvm.x86.sse.ldmxcsr(ptr %own)",
        "fp_update": "  %old = alloca i32, align 4\n"
                   "  %new = alloca i32, align 4\n"
                   "  call void @llvm.x86.sse.stmxcsr(ptr %old)\n"
                   "  %was = load i32, ptr %old, align 4\n"
                   "  %kept = and i32 %was, %keep\n"
                   "  %mode = or i32 %kept, %set\n"
                   "  store i32 %mode, ptr %new, align 4\n"
                   "  call void @llvm.x86.sse.ldmxcsr(ptr %new)\n"
                   "  ret i32 %was",
    }


def _steering(triple: str) -> dict[str, str]:
    """The IR that places woken workers off their caller's CPU (`pool.steer`), where the
    C library has the calls for it (glibc and musl on Linux); elsewhere nothing."""
    if "linux" not in triple or "android" in triple:
        return {"steer_decl": "", "steer_body": "  ret void",
                "mask_save": "", "mask_restore": "  br label %found",
                "from_sleep": "[ %k, %woke ]"}
    return {
        "steer_decl": "declare i32 @sched_getcpu()\n"
                      "declare i32 @sched_getaffinity(i32, i64, ptr)\n"
                      "declare i32 @pthread_setaffinity_np(i64, i64, ptr)\n"
                      "declare i32 @pthread_getaffinity_np(i64, i64, ptr)\n"
                      "declare i64 @pthread_self()\n"
                      "declare void @llvm.memset.p0.i64(ptr, i8, i64, i1)",
        "steer_body": _STEER.format(cpu_set=CPU_SET_BYTES, cpu_bits=CPU_SET_BYTES * 8,
                                    max_workers=MAX_WORKERS),
        "from_sleep": "[ %k, %woke ], [ %k, %restore ]",
        # a worker's own CPUs, as it was created with them; 0 if they could not be read
        "mask_save": "  %me = call i64 @pthread_self()\n"
                     f"  %got = call i32 @pthread_getaffinity_np(i64 %me, i64 {CPU_SET_BYTES}, "
                     "ptr %mask)\n"
                     "  %mask.ok = icmp eq i32 %got, 0",
        "mask_restore": "  br i1 %mask.ok, label %restore, label %found\n"
                        "restore:\n"
                        f"  %rs = call i32 @pthread_setaffinity_np(i64 %me, i64 {CPU_SET_BYTES}, "
                        "ptr %mask)\n"
                        "  br label %found",
    }


def pool_ir(triple: str) -> str:
    """The pool's LLVM module for ``triple``, as text."""
    pause, pause_decl = _pause(triple)
    return _TEMPLATE.format(
        triple=triple, pause=pause, pause_decl=pause_decl, nthreads=NUM_THREADS_SYMBOL,
        parallel_for=PARALLEL_FOR_SYMBOL, worker_spins=WORKER_SPINS, spin_ns=SPIN_NS_SYMBOL,
        worker_pause_spins=WORKER_PAUSE_SPINS, fp_update_symbol=FP_UPDATE_SYMBOL,
        caller_spins=CALLER_SPINS, yield_lost_ns=YIELD_LOST_NS, crowded_ns=CROWDED_NS,
        crowded_pause_spins=CROWDED_PAUSE_SPINS,
        max_workers=MAX_WORKERS, slots=MAX_WORKERS + 1,
        sync=SYNC_BYTES,
        cpu_set=CPU_SET_BYTES, cpu_bits=CPU_SET_BYTES * 8, **_fp_mode(triple),
        **_steering(triple))


_STEER = """\
  %allowed = alloca [{cpu_set} x i8], align 16
  %one = alloca [{cpu_set} x i8], align 16
  %cpu = call i32 @sched_getcpu()
  %cpu.ok = icmp ult i32 %cpu, {cpu_bits}
  br i1 %cpu.ok, label %get, label %exit
get:
  %r = call i32 @sched_getaffinity(i32 0, i64 {cpu_set}, ptr %allowed)
  %r.ok = icmp eq i32 %r, 0
  br i1 %r.ok, label %start, label %exit
start:
  %n32 = load i32, ptr @pool.workers, align 4
  %n = zext i32 %n32 to i64
  %c0 = zext i32 %cpu to i64
  br label %worker
worker:
  %i = phi i64 [ 0, %start ], [ %i1, %check ], [ %i1, %send ]
  %cur = phi i64 [ %c0, %start ], [ %cur, %check ], [ %c, %send ]
  %more = icmp ult i64 %i, %n
  br i1 %more, label %check, label %exit
check:
  %i1 = add i64 %i, 1
  %slp.p = getelementptr inbounds [{max_workers} x i32], ptr @pool.asleep, i64 0, i64 %i
  %slp = load i32, ptr %slp.p, align 4
  %is.asleep = icmp ne i32 %slp, 0
  br i1 %is.asleep, label %scan, label %worker
scan:
  %k = phi i64 [ 1, %check ], [ %k1, %scan.next ]
  %turned = icmp ugt i64 %k, {cpu_bits}
  br i1 %turned, label %exit, label %scan.test
scan.test:
  %sum = add i64 %cur, %k
  %c = urem i64 %sum, {cpu_bits}
  %byte.i = lshr i64 %c, 3
  %byte.p = getelementptr inbounds i8, ptr %allowed, i64 %byte.i
  %byte = load i8, ptr %byte.p, align 1
  %bit.i64 = and i64 %c, 7
  %bit.i = trunc i64 %bit.i64 to i8
  %bit.v = shl i8 1, %bit.i
  %has = and i8 %byte, %bit.v
  %allowed.c = icmp ne i8 %has, 0
  %other = icmp ne i64 %c, %c0
  %take = and i1 %allowed.c, %other
  br i1 %take, label %send, label %scan.next
scan.next:
  %k1 = add i64 %k, 1
  br label %scan
send:
  call void @llvm.memset.p0.i64(ptr %one, i8 0, i64 {cpu_set}, i1 false)
  %one.p = getelementptr inbounds i8, ptr %one, i64 %byte.i
  store i8 %bit.v, ptr %one.p, align 1
  %tid.p = getelementptr inbounds [{max_workers} x i64], ptr @pool.tids, i64 0, i64 %i
  %tid = load i64, ptr %tid.p, align 8
  %set = call i32 @pthread_setaffinity_np(i64 %tid, i64 {cpu_set}, ptr %one)
  br label %worker
exit:
  ret void"""

# Names: @pool.* are internal. Hot words each have a cache line (align 64), so that the
# claim counter's traffic does not slow down workers polling the job word.
_TEMPLATE = """
target triple = "{triple}"

@{nthreads} = external global i32

@pool.mutex = internal global [{sync} x i8] zeroinitializer, align 16
@pool.cond = internal global [{sync} x i8] zeroinitializer, align 16
@pool.owned = internal global i32 0, align 64
@pool.job = internal global i64 0, align 64
@pool.active = internal global i64 0, align 64
@pool.sleepers = internal global i32 0, align 64
@pool.next = internal global [{slots} x [8 x i64]] zeroinitializer, align 64
@pool.parts = internal global i64 1, align 64
@pool.done = internal global i64 0, align 64
@pool.workers = internal global i32 0, align 64
@pool.ready = internal global i32 0
@pool.fn = internal global ptr null
@pool.data = internal global ptr null
@pool.n = internal global i64 0
@pool.grain = internal global i64 0
@pool.chunks = internal global i64 0
@pool.helpers = internal global i64 0
@pool.fpmode = internal global i32 0, align 4
@pool.tids = internal global [{max_workers} x i64] zeroinitializer, align 8
@pool.asleep = internal global [{max_workers} x i32] zeroinitializer, align 4
@{spin_ns} = hidden global i64 0, align 8

declare i32 @pthread_create(ptr, ptr, ptr, ptr)
declare i32 @pthread_detach(i64)
declare i32 @pthread_mutex_init(ptr, ptr)
declare i32 @pthread_mutex_lock(ptr)
declare i32 @pthread_mutex_unlock(ptr)
declare i32 @pthread_cond_init(ptr, ptr)
declare i32 @pthread_cond_wait(ptr, ptr)
declare i32 @pthread_cond_broadcast(ptr)
declare i32 @sched_yield()
declare i32 @clock_gettime(i32, ptr)
{pause_decl}
{fp_decl}
{steer_decl}

define i32 @{fp_update_symbol}(i32 %keep, i32 %set) nounwind {{
entry:
{fp_update}
}}

; CLOCK_MONOTONIC (1 on Linux, every architecture) in nanoseconds.
define internal i64 @pool.now() nounwind {{
entry:
  %ts = alloca [2 x i64], align 16
  %r = call i32 @clock_gettime(i32 1, ptr %ts)
  %sec = load i64, ptr %ts, align 16
  %nsp = getelementptr inbounds [2 x i64], ptr %ts, i64 0, i64 1
  %nsec = load i64, ptr %nsp, align 8
  %ns = mul i64 %sec, 1000000000
  %t = add i64 %ns, %nsec
  ret i64 %t
}}

; Claim chunks of the current job until none is left; how many this thread ran. The chunks
; are split into @pool.parts contiguous ranges, one per participant (the caller 0, the
; workers 1, 2, ... in the order they join); each claims from its own range first, then
; from what is left of the others' (from %self on, wrapping around).
define internal i64 @pool.claim(ptr %fn, ptr %data, i64 %n, i64 %grain, i64 %chunks,
                                i64 %self) nounwind {{
entry:
  %parts = load atomic i64, ptr @pool.parts seq_cst, align 8
  br label %range
range:
  %k = phi i64 [ 0, %entry ], [ %k1, %range.done ]
  %count = phi i64 [ 0, %entry ], [ %count2, %range.done ]
  %more.r = icmp ult i64 %k, %parts
  br i1 %more.r, label %range.body, label %exit
range.body:
  %rr = add i64 %self, %k
  %r = urem i64 %rr, %parts
  %r1 = add i64 %r, 1
  %e0 = mul i64 %r1, %chunks
  %end = udiv i64 %e0, %parts
  %slot = getelementptr inbounds [{slots} x [8 x i64]], ptr @pool.next, i64 0, i64 %r, i64 0
  br label %take
take:
  %count2 = phi i64 [ %count, %range.body ], [ %count3, %run ]
  %c = atomicrmw add ptr %slot, i64 1 seq_cst
  %ok = icmp ult i64 %c, %end
  br i1 %ok, label %run, label %range.done
run:
  %lo = mul i64 %c, %grain
  %left = sub i64 %n, %lo
  %short = icmp ult i64 %left, %grain
  %len = select i1 %short, i64 %left, i64 %grain
  %hi = add i64 %lo, %len
  call void %fn(ptr %data, i64 %lo, i64 %hi)
  %count3 = add i64 %count2, 1
  br label %take
range.done:
  %k1 = add i64 %k, 1
  br label %range
exit:
  ret i64 %count
}}

; Wait until the i64 at %p equals %want: spin, then yield the core on each check.
define internal void @pool.wait_i64(ptr %p, i64 %want) nounwind {{
entry:
  br label %check
check:
  %i = phi i64 [ 0, %entry ], [ %i1, %pause ], [ %i1, %yield ]
  %v = load atomic i64, ptr %p seq_cst, align 8
  %ok = icmp eq i64 %v, %want
  br i1 %ok, label %exit, label %again
again:
  %i1 = add i64 %i, 1
  %spin = icmp ult i64 %i, {caller_spins}
  br i1 %spin, label %pause, label %yield
pause:
  {pause}
  br label %check
yield:
  %y = call i32 @sched_yield()
  br label %check
exit:
  ret void
}}

; Before the caller wakes sleeping workers (holding the mutex): each sleeping worker may run
; on one CPU only, the next one its caller may run on after the last one given, never the
; caller's own; `pool.worker` frees itself once it runs.
define internal void @pool.steer() nounwind {{
entry:
{steer_body}
}}

; A worker: wait for a job it has not seen, join it, claim chunks, leave; forever.
define internal ptr @pool.worker(ptr %arg) nounwind {{
entry:
  %own = alloca i32, align 4  ; the worker's own floating-point mode, while it runs a job
  %mask = alloca [{cpu_set} x i8], align 16  ; the CPUs it may run on, as created
  %crowded = alloca i64, align 8  ; until when its core is shared (see spin.yield)
  store i64 0, ptr %crowded, align 8
  %index = ptrtoint ptr %arg to i64  ; its slot in @pool.tids and @pool.asleep
  %asleep = getelementptr inbounds [{max_workers} x i32], ptr @pool.asleep, i64 0, i64 %index
{mask_save}
  br label %wait
wait:
  ; 0 is never an open job: a new worker joins the job open when it starts, if any
  %seen = phi i64 [ 0, %entry ], [ %job, %leave ]
  %idle.from = call i64 @pool.now()
  br label %spin
spin:
  %i = phi i64 [ 0, %wait ], [ %i1, %spin.more ], [ %i1, %spin.clock ]
  %j = load atomic i64, ptr @pool.job seq_cst, align 8
  %j.odd = trunc i64 %j to i1
  %j.new = icmp ne i64 %j, %seen
  %j.go = and i1 %j.odd, %j.new
  br i1 %j.go, label %found, label %spin.next
spin.next:
  %i1 = add i64 %i, 1
  %early = icmp ult i64 %i, {worker_pause_spins}
  br i1 %early, label %spin.early, label %spin.yield
spin.early:
  ; on a shared core, pause only long enough to bridge the gaps between one call's regions
  %short = icmp eq i64 %i, {crowded_pause_spins}
  br i1 %short, label %spin.crowded, label %spin.pause
spin.crowded:
  %c0 = call i64 @pool.now()
  %cuntil = load i64, ptr %crowded, align 8
  %cshared = icmp slt i64 %c0, %cuntil
  br i1 %cshared, label %sleep, label %spin.pause
spin.pause:
  {pause}
  br label %spin.more
spin.yield:
  ; past the first stretch, give the core to any thread that wants it (another library's
  ; spinning workers, a busy process) while staying awake for the next region; but where a
  ; yield lately kept it off the core for long, another thread wants the core on and on:
  ; sleep, to be woken ahead of that thread when the next region comes
  %y0 = call i64 @pool.now()
  %until = load i64, ptr %crowded, align 8
  %shared = icmp slt i64 %y0, %until
  br i1 %shared, label %sleep, label %spin.give
spin.give:
  %yy = call i32 @sched_yield()
  %y1 = call i64 @pool.now()
  %yt = sub i64 %y1, %y0
  %lost = icmp sgt i64 %yt, {yield_lost_ns}
  br i1 %lost, label %spin.lost, label %spin.more
spin.lost:
  %until1 = add i64 %y1, {crowded_ns}
  store i64 %until1, ptr %crowded, align 8
  br label %sleep
spin.more:
  %more = icmp ult i64 %i1, {worker_spins}
  br i1 %more, label %spin, label %spin.late
spin.late:
  ; past the counted checks: yield on until {spin_ns} nanoseconds of idleness (0: sleep now)
  %limit = load atomic i64, ptr @{spin_ns} monotonic, align 8
  %timed = icmp sgt i64 %limit, 0
  br i1 %timed, label %spin.clock, label %sleep
spin.clock:
  %clock = call i64 @pool.now()
  %idle = sub i64 %clock, %idle.from
  %awake = icmp slt i64 %idle, %limit
  br i1 %awake, label %spin, label %sleep
sleep:
  %l0 = call i32 @pthread_mutex_lock(ptr @pool.mutex)
  %s0 = atomicrmw add ptr @pool.sleepers, i32 1 seq_cst
  store i32 1, ptr %asleep, align 4  ; under the mutex, which `pool.steer` holds
  br label %sleep.check
sleep.check:
  %k = load atomic i64, ptr @pool.job seq_cst, align 8
  %k.odd = trunc i64 %k to i1
  %k.new = icmp ne i64 %k, %seen
  %k.go = and i1 %k.odd, %k.new
  br i1 %k.go, label %woken, label %sleep.wait
sleep.wait:
  %w0 = call i32 @pthread_cond_wait(ptr @pool.cond, ptr @pool.mutex)
  br label %sleep.check
woken:
  %s1 = atomicrmw sub ptr @pool.sleepers, i32 1 seq_cst
  store i32 0, ptr %asleep, align 4
  %u0 = call i32 @pthread_mutex_unlock(ptr @pool.mutex)
  br label %woke
woke:
  ; running now, wherever `pool.steer` sent it: free to move again
{mask_restore}
found:
  %job = phi i64 [ %j, %spin ], {from_sleep}
  %before = atomicrmw add ptr @pool.active, i64 1 seq_cst
  %now = load atomic i64, ptr @pool.job seq_cst, align 8
  %same = icmp eq i64 %now, %job
  br i1 %same, label %joined, label %leave
joined:
  %helpers = load i64, ptr @pool.helpers, align 8
  %wanted = icmp ult i64 %before, %helpers
  br i1 %wanted, label %work, label %leave
work:
  %fn = load ptr, ptr @pool.fn, align 8
  %data = load ptr, ptr @pool.data, align 8
  %n = load i64, ptr @pool.n, align 8
  %grain = load i64, ptr @pool.grain, align 8
  %chunks = load i64, ptr @pool.chunks, align 8
{fp_enter}
  %part = add i64 %before, 1  ; its place among the job's participants
  %ran = call i64 @pool.claim(ptr %fn, ptr %data, i64 %n, i64 %grain, i64 %chunks,
                             i64 %part)
{fp_leave}
  %d0 = atomicrmw add ptr @pool.done, i64 %ran seq_cst
  br label %leave
leave:
  %a0 = atomicrmw sub ptr @pool.active, i64 1 seq_cst
  br label %wait
}}

; Create workers until there are %want (or pthread_create fails); how many there are.
; Only the pool's owner calls it.
define internal i64 @pool.grow(i64 %want) nounwind {{
entry:
  %tid = alloca [2 x i64], align 16
  %ready = load i32, ptr @pool.ready, align 4
  %fresh = icmp eq i32 %ready, 0
  br i1 %fresh, label %init, label %loop
init:
  %m = call i32 @pthread_mutex_init(ptr @pool.mutex, ptr null)
  %c = call i32 @pthread_cond_init(ptr @pool.cond, ptr null)
  store i32 1, ptr @pool.ready, align 4
  br label %loop
loop:
  %have32 = load i32, ptr @pool.workers, align 4
  %have = zext i32 %have32 to i64
  %enough = icmp uge i64 %have, %want
  br i1 %enough, label %exit, label %create
create:
  %slot = inttoptr i32 %have32 to ptr
  %rc = call i32 @pthread_create(ptr %tid, ptr null, ptr @pool.worker, ptr %slot)
  %failed = icmp ne i32 %rc, 0
  br i1 %failed, label %exit, label %created
created:
  %t = load i64, ptr %tid, align 16
  %tslot = getelementptr inbounds [{max_workers} x i64], ptr @pool.tids, i64 0, i32 %have32
  store i64 %t, ptr %tslot, align 8
  %dt = call i32 @pthread_detach(i64 %t)
  %have1 = add i32 %have32, 1
  store i32 %have1, ptr @pool.workers, align 4
  br label %loop
exit:
  ret i64 %have
}}

define hidden void @{parallel_for}(ptr %fn, ptr %data, i64 %n, i64 %grain0) nounwind {{
entry:
  %empty = icmp sle i64 %n, 0
  br i1 %empty, label %exit, label %size
size:
  %small = icmp slt i64 %grain0, 1
  %grain = select i1 %small, i64 1, i64 %grain0
  %nm1 = sub i64 %n, 1
  %q = udiv i64 %nm1, %grain
  %chunks = add i64 %q, 1
  %t32 = load i32, ptr @{nthreads}, align 4
  %t = sext i32 %t32 to i64
  %t.few = icmp slt i64 %t, %chunks
  %t.used = select i1 %t.few, i64 %t, i64 %chunks
  %h0 = sub i64 %t.used, 1
  %h.many = icmp sgt i64 %h0, {max_workers}
  %want = select i1 %h.many, i64 {max_workers}, i64 %h0
  %alone = icmp slt i64 %want, 1
  br i1 %alone, label %serial, label %own
own:
  %pair = cmpxchg ptr @pool.owned, i32 0, i32 1 seq_cst seq_cst
  %won = extractvalue {{ i32, i1 }} %pair, 1
  br i1 %won, label %grow, label %serial
grow:
  ; a worker still inside the last job (descheduled between its last claim and leaving)
  ; might read this job's words half-written: run this region alone rather than wait for it
  %inside = load atomic i64, ptr @pool.active seq_cst, align 8
  %straggler = icmp ne i64 %inside, 0
  br i1 %straggler, label %release.alone, label %grow.workers
grow.workers:
  %have = call i64 @pool.grow(i64 %want)
  %h.fewer = icmp ult i64 %have, %want
  %helpers = select i1 %h.fewer, i64 %have, i64 %want
  %none = icmp eq i64 %helpers, 0
  br i1 %none, label %release.alone, label %publish
release.alone:
  store atomic i32 0, ptr @pool.owned seq_cst, align 4
  br label %serial
publish:
{fp_publish}
  store ptr %fn, ptr @pool.fn, align 8
  store ptr %data, ptr @pool.data, align 8
  store i64 %n, ptr @pool.n, align 8
  store i64 %grain, ptr @pool.grain, align 8
  store i64 %chunks, ptr @pool.chunks, align 8
  store i64 %helpers, ptr @pool.helpers, align 8
  ; the caller's range and each helper's: [r·chunks/parts, (r+1)·chunks/parts)
  %parts = add i64 %helpers, 1
  store atomic i64 %parts, ptr @pool.parts seq_cst, align 8
  br label %ranges
ranges:
  %ri = phi i64 [ 0, %publish ], [ %ri1, %ranges ]
  %s0 = mul i64 %ri, %chunks
  %start = udiv i64 %s0, %parts
  %rslot = getelementptr inbounds [{slots} x [8 x i64]], ptr @pool.next, i64 0, i64 %ri, i64 0
  store atomic i64 %start, ptr %rslot seq_cst, align 8
  %ri1 = add i64 %ri, 1
  %all = icmp eq i64 %ri1, %parts
  br i1 %all, label %published, label %ranges
published:
  store atomic i64 0, ptr @pool.done seq_cst, align 8
  %old = load atomic i64, ptr @pool.job seq_cst, align 8
  %open = add i64 %old, 1
  store atomic i64 %open, ptr @pool.job seq_cst, align 8
  %sleeping = load atomic i32, ptr @pool.sleepers seq_cst, align 4
  %wake = icmp ne i32 %sleeping, 0
  br i1 %wake, label %signal, label %work
signal:
  %l = call i32 @pthread_mutex_lock(ptr @pool.mutex)
  call void @pool.steer()
  %b = call i32 @pthread_cond_broadcast(ptr @pool.cond)
  %u = call i32 @pthread_mutex_unlock(ptr @pool.mutex)
  br label %work
work:
  %ran = call i64 @pool.claim(ptr %fn, ptr %data, i64 %n, i64 %grain, i64 %chunks,
                             i64 0)
  %d = atomicrmw add ptr @pool.done, i64 %ran seq_cst
  call void @pool.wait_i64(ptr @pool.done, i64 %chunks)
  %closed = add i64 %open, 1
  store atomic i64 %closed, ptr @pool.job seq_cst, align 8
  store atomic i32 0, ptr @pool.owned seq_cst, align 4
  br label %exit
serial:
  call void %fn(ptr %data, i64 0, i64 %n)
  br label %exit
exit:
  ret void
}}
"""

__all__ = ["PARALLEL_FOR_SYMBOL", "WORKER_SPINS", "pool_ir"]
