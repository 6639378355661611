# fiber_sched's commands for gdb: list a program's fibers and print a parked fiber's
# backtrace.
#
#   (gdb) source tools/fiber_sched_gdb.py
#   (gdb) info fibers          every live fiber: id, name, state, what a parked one waits for
#   (gdb) fiber bt 12          the backtrace of fiber 12, from the registers it saved when it
#                              switched out (the asm backends, x86-64 System V and AArch64)
#
# They read the registry of live fibers (src/impl/registry.ipp: fsched::detail::
# registry_segments) and need the program's debug information (-g). `fiber bt` writes the
# saved registers into the selected thread for the time of the backtrace and restores them
# after, so it needs a live process (not a core file); gdb unwinds from there with the debug
# information's call-frame data, as for any thread. Read-only otherwise: nothing in the
# program runs.

import gdb

_STATES = {0: "ready", 1: "suspended", 2: "running", 3: "finished", 4: "running",
           5: "parked", 6: "parked"}
_WAITS = {0: "", 1: "Mutex", 2: "ConditionVariable", 3: "WaitGroup", 4: "Channel send",
          5: "Channel receive", 6: "sleep", 7: "io", 8: "yield", 9: "Semaphore", 10: "Latch",
          11: "Barrier", 12: "SharedMutex", 13: "SharedMutex shared", 14: "Event",
          15: "ConditionVariableAny", 16: "select", 17: "Future", 18: "parallel_for", 19: "wait"}


def _raw(value, type_name):
    """The bytes of a std::atomic<T> (laid out as its T) read as `type_name`."""
    return value.address.cast(gdb.lookup_type(type_name).pointer()).dereference()


def _raw_pointer(value, pointee):
    return value.address.cast(pointee.pointer().pointer()).dereference()


def _fibers():
    fiber_t = gdb.lookup_type("fsched::Fiber")
    chunk_t = gdb.lookup_type("fsched::detail::RegistryChunk")
    segment_t = gdb.lookup_type("fsched::detail::RegistrySegment")
    head = gdb.parse_and_eval("fsched::detail::registry_segments")
    segment = _raw_pointer(head, segment_t)
    while int(segment) != 0:
        chunk = _raw_pointer(segment["chunks"], chunk_t)
        while int(chunk) != 0:
            slots = chunk["slots"]
            for i in range(int(chunk["size"])):
                fiber = _raw_pointer(slots[i], fiber_t)
                if int(fiber) != 0 and not int(fiber) & 1:  # null, or a free slot's link
                    yield fiber
            chunk = chunk["next"]
        segment = segment["next"]


def _fiber_fields(fiber):
    f = fiber.dereference()
    fid = int(_raw(f["id_"], "unsigned long long"))
    name_ptr = _raw_pointer(f["name_"], gdb.lookup_type("char"))
    name = name_ptr.string() if int(name_ptr) != 0 else ""
    state = int(_raw(f["state_"]["state_"], "unsigned char"))
    kind = int(_raw(f["wait_"]["kind"], "unsigned char"))
    return fid, name, state, kind


def _find(fid):
    for fiber in _fibers():
        if _fiber_fields(fiber)[0] == fid:
            return fiber
    return None


class InfoFibers(gdb.Command):
    """List fiber_sched's live fibers: id, name, state, what a parked fiber waits for."""

    def __init__(self):
        super().__init__("info fibers", gdb.COMMAND_STATUS)

    def invoke(self, arg, from_tty):
        rows = []
        finished = 0
        for fiber in _fibers():
            fid, name, state, kind = _fiber_fields(fiber)
            if state == 3:
                finished += 1
                continue
            words = _STATES.get(state, "?")
            if words == "running" and kind == 8:
                words = "runnable (yield)"
            if words == "parked" and _WAITS.get(kind):
                obj = int(fiber.dereference()["wait_"]["object"])
                where = _WAITS[kind] + (" 0x%x" % obj if obj else "")
                # Its wait is over (Fiber::woken_): it waits in a run queue, as fiber_report() says.
                if int(_raw(fiber.dereference()["woken_"], "unsigned char")):
                    words = "runnable (woken) from " + where
                else:
                    words += " on " + where
            rows.append((fid, name, words))
        rows.sort()
        for fid, name, words in rows:
            print("fiber %d%s: %s" % (fid, " (%s)" % name if name else "", words))
        print("%d live fibers%s" % (len(rows), ", %d finished" % finished if finished else ""))


# The saved frame of each asm backend (src/impl/context_*.ipp draws them): where each
# register is, from the saved stack pointer, and the stack pointer once the frame is popped.
_FRAMES = {
    "x86-64": ({"rbp": 48, "rbx": 40, "r12": 32, "r13": 24, "r14": 16, "r15": 8, "pc": 56}, 64, "rsp"),
    "aarch64": (dict([("x%d" % (19 + i), 8 * i) for i in range(10)] + [("x29", 80), ("x30", 88), ("pc", 88)]),
                176, "sp"),
}


def _arch():
    name = gdb.selected_frame().architecture().name()
    if "x86-64" in name or "x86_64" in name:
        return "x86-64"
    if "aarch64" in name:
        return "aarch64"
    raise gdb.GdbError("fiber bt: the %s architecture is not supported (x86-64 and AArch64 are)" % name)


class FiberCommand(gdb.Command):
    """fiber_sched's fiber commands: fiber bt ID."""

    def __init__(self):
        super().__init__("fiber", gdb.COMMAND_STACK, gdb.COMPLETE_NONE, True)


class FiberBt(gdb.Command):
    """fiber bt ID: the backtrace of a parked or suspended fiber, from its saved registers."""

    def __init__(self):
        super().__init__("fiber bt", gdb.COMMAND_STACK)

    def invoke(self, arg, from_tty):
        if not arg.strip():
            raise gdb.GdbError("usage: fiber bt ID")
        fid = int(gdb.parse_and_eval(arg))
        fiber = _find(fid)
        if fiber is None:
            raise gdb.GdbError("fiber bt: no live fiber %d" % fid)
        state = _fiber_fields(fiber)[2]
        if state not in (1, 5, 6):
            raise gdb.GdbError("fiber bt: fiber %d is %s; only a parked or suspended fiber has saved "
                               "registers (a running one is in `thread apply all bt`)" % (fid, _STATES.get(state)))
        offsets, frame_size, sp_name = _FRAMES[_arch()]
        sp = int(fiber.dereference()["context_"]["sp"])
        if sp == 0:
            raise gdb.GdbError("fiber bt: fiber %d has no saved context" % fid)
        word = gdb.lookup_type("unsigned long").pointer()
        gdb.execute("frame 0", to_string=True)
        saved = {}
        names = list(offsets) + [sp_name]
        for reg in names:
            saved[reg] = int(gdb.parse_and_eval("$" + reg))
        try:
            for reg, offset in offsets.items():
                value = int(gdb.Value(sp + offset).cast(word).dereference())
                gdb.execute("set $%s = %d" % (reg, value), to_string=True)
            gdb.execute("set $%s = %d" % (sp_name, sp + frame_size), to_string=True)
            gdb.execute("bt")
        finally:
            for reg in names:
                gdb.execute("set $%s = %d" % (reg, saved[reg]), to_string=True)
            gdb.execute("frame 0", to_string=True)


InfoFibers()
FiberCommand()
FiberBt()
