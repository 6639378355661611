// The trace recorder and the flight recorder (fsched::trace). Each test records real work
// (a channel ping-pong across workers, sleeps, named tasks), reads the file back with the
// small JSON parser below (C++, so the Windows variant checks it too) and holds it to what
// Perfetto UI, chrome://tracing and speedscope need: one object with a traceEvents array;
// on each tid, named by a thread_name metadata event, complete events ("X") that nest or
// are disjoint, each with the fiber's id in args; every flow start matched by one finish.
// Then the bounds: a recording's cap drops and counts, a ring keeps the newest n events
// per thread; misuse; stop() while fibers switch (TSan-clean); the hooks still called.
#include "fiber_sched.hpp"
#include "helpers.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

using fsched::Scheduler;

namespace {

// --- a small JSON parser, enough to check the writer ------------------------------------

struct Json {
    enum class Type { Null, Bool, Number, String, Array, Object };
    Type type = Type::Null;
    bool boolean = false;
    double number = 0;
    std::string text;
    std::vector<Json> items;
    std::vector<std::pair<std::string, Json>> members;

    const Json* get(const std::string& key) const {
        for (const auto& member : members) {
            if (member.first == key) return &member.second;
        }
        return nullptr;
    }
    bool is(Type t) const { return type == t; }
};

class JsonParser {
public:
    explicit JsonParser(const std::string& text) : text_(text) {}

    // The document, or false when it is not valid JSON (with where it went wrong in error).
    bool parse(Json& out) {
        skip_space();
        if (!value(out, 0)) return false;
        skip_space();
        if (at_ != text_.size()) return fail("text after the value");
        return true;
    }
    std::string error;

private:
    bool fail(const char* what) {
        if (error.empty()) error = std::string(what) + " at offset " + std::to_string(at_);
        return false;
    }
    void skip_space() {
        while (at_ < text_.size() && (text_[at_] == ' ' || text_[at_] == '\n' || text_[at_] == '\r' || text_[at_] == '\t')) ++at_;
    }
    bool literal(const char* word) {
        const std::string w(word);
        if (text_.compare(at_, w.size(), w) != 0) return fail("bad literal");
        at_ += w.size();
        return true;
    }
    bool value(Json& out, int depth) {
        if (depth > 64) return fail("too deep");
        if (at_ >= text_.size()) return fail("unexpected end");
        const char c = text_[at_];
        if (c == '{') return object(out, depth);
        if (c == '[') return array(out, depth);
        if (c == '"') {
            out.type = Json::Type::String;
            return string(out.text);
        }
        if (c == 't' || c == 'f') {
            out.type = Json::Type::Bool;
            out.boolean = c == 't';
            return literal(c == 't' ? "true" : "false");
        }
        if (c == 'n') return literal("null");
        return number(out);
    }
    bool number(Json& out) {
        const std::size_t begin = at_;
        if (at_ < text_.size() && text_[at_] == '-') ++at_;
        auto digits = [&] {
            const std::size_t from = at_;
            while (at_ < text_.size() && text_[at_] >= '0' && text_[at_] <= '9') ++at_;
            return at_ > from;
        };
        if (!digits()) return fail("bad number");
        if (at_ < text_.size() && text_[at_] == '.') {
            ++at_;
            if (!digits()) return fail("bad fraction");
        }
        if (at_ < text_.size() && (text_[at_] == 'e' || text_[at_] == 'E')) {
            ++at_;
            if (at_ < text_.size() && (text_[at_] == '+' || text_[at_] == '-')) ++at_;
            if (!digits()) return fail("bad exponent");
        }
        out.type = Json::Type::Number;
        out.number = std::stod(text_.substr(begin, at_ - begin));
        return true;
    }
    bool string(std::string& out) {
        ++at_;  // the opening quote
        while (at_ < text_.size()) {
            const char c = text_[at_++];
            if (c == '"') return true;
            if (static_cast<unsigned char>(c) < 0x20) return fail("control character in a string");
            if (c != '\\') {
                out += c;
                continue;
            }
            if (at_ >= text_.size()) break;
            const char e = text_[at_++];
            switch (e) {
            case '"': out += '"'; break;
            case '\\': out += '\\'; break;
            case '/': out += '/'; break;
            case 'b': out += '\b'; break;
            case 'f': out += '\f'; break;
            case 'n': out += '\n'; break;
            case 'r': out += '\r'; break;
            case 't': out += '\t'; break;
            case 'u': {
                if (at_ + 4 > text_.size()) return fail("short \\u escape");
                const unsigned long code = std::stoul(text_.substr(at_, 4), nullptr, 16);
                at_ += 4;
                out += code < 0x80 ? static_cast<char>(code) : '?';
                break;
            }
            default: return fail("bad escape");
            }
        }
        return fail("unterminated string");
    }
    bool array(Json& out, int depth) {
        out.type = Json::Type::Array;
        ++at_;
        skip_space();
        if (at_ < text_.size() && text_[at_] == ']') {
            ++at_;
            return true;
        }
        for (;;) {
            skip_space();
            out.items.emplace_back();
            if (!value(out.items.back(), depth + 1)) return false;
            skip_space();
            if (at_ < text_.size() && text_[at_] == ',') {
                ++at_;
                continue;
            }
            if (at_ < text_.size() && text_[at_] == ']') {
                ++at_;
                return true;
            }
            return fail("expected , or ]");
        }
    }
    bool object(Json& out, int depth) {
        out.type = Json::Type::Object;
        ++at_;
        skip_space();
        if (at_ < text_.size() && text_[at_] == '}') {
            ++at_;
            return true;
        }
        for (;;) {
            skip_space();
            if (at_ >= text_.size() || text_[at_] != '"') return fail("expected a key");
            std::string key;
            if (!string(key)) return false;
            skip_space();
            if (at_ >= text_.size() || text_[at_] != ':') return fail("expected :");
            ++at_;
            skip_space();
            out.members.emplace_back(std::move(key), Json());
            if (!value(out.members.back().second, depth + 1)) return false;
            skip_space();
            if (at_ < text_.size() && text_[at_] == ',') {
                ++at_;
                continue;
            }
            if (at_ < text_.size() && text_[at_] == '}') {
                ++at_;
                return true;
            }
            return fail("expected , or }");
        }
    }

    const std::string& text_;
    std::size_t at_ = 0;
};

using test::read_whole_file;

// A file in the test's working directory (the build directory under ctest), removed after.
struct TempFile {
    // Unique per process: CI runs the variants at once in one directory, and two of them
    // writing one file made each other's traces invalid JSON.
    explicit TempFile(const char* name)
        : path(std::string("fiber_sched_test_") + name + "-" +
               std::to_string(std::chrono::steady_clock::now().time_since_epoch().count()) + ".json") {
        std::remove(path.c_str());
    }
    ~TempFile() { std::remove(path.c_str()); }
    TempFile(const TempFile&) = delete;
    TempFile& operator=(const TempFile&) = delete;
    std::string path;
};

// --- what every trace must be ------------------------------------------------------------

struct Slice {
    double begin, end;
    std::uint64_t id;
    std::string name, ended, cat, parked;
};

// The trace, parsed and checked; what the tests look at further.
struct CheckedTrace {
    std::map<std::int64_t, std::vector<Slice>> slices;  // per tid, in order of begin
    std::map<std::int64_t, std::string> thread_names;
    std::map<std::int64_t, std::size_t> flow_starts;    // per tid
    std::size_t flows = 0;                              // matched start/finish pairs
    std::set<std::string> names;                        // of the slices
    std::uint64_t dropped = 0;                          // otherData.dropped_events
    std::string mode;
};

const Json* member(const Json& object, const char* key, Json::Type type) {
    const Json* found = object.get(key);
    return found && found->is(type) ? found : nullptr;
}

// Parses the trace at `path` and checks the rules every viewer relies on (the test's top
// comment); fails the test case with what broke.
CheckedTrace check_trace(const std::string& path) {
    CheckedTrace trace;
    const std::string text = read_whole_file(path);
    REQUIRE_MESSAGE(!text.empty(), "no trace written to " << path);
    Json root;
    JsonParser parser(text);
    const bool valid = parser.parse(root);
    REQUIRE_MESSAGE(valid, "not JSON: " << parser.error);
    REQUIRE(root.is(Json::Type::Object));
    const Json* events = member(root, "traceEvents", Json::Type::Array);
    REQUIRE(events != nullptr);
    if (const Json* other = member(root, "otherData", Json::Type::Object)) {
        if (const Json* dropped = member(*other, "dropped_events", Json::Type::Number)) {
            trace.dropped = static_cast<std::uint64_t>(dropped->number);
        }
        if (const Json* mode = member(*other, "mode", Json::Type::String)) trace.mode = mode->text;
    }
    std::map<double, int> starts, finishes;  // flow id -> count
    std::set<std::int64_t> tids_used;
    // Per event, a failed rule fails the test case at once (a CHECK for each of thousands
    // of events would only slow the test down).
    for (const Json& event : events->items) {
        if (!event.is(Json::Type::Object)) FAIL("an event that is not an object");
        const Json* ph = member(event, "ph", Json::Type::String);
        const Json* tid = member(event, "tid", Json::Type::Number);
        if (!ph || !tid || !member(event, "pid", Json::Type::Number)) FAIL("an event without ph, pid or tid");
        const Json* name = member(event, "name", Json::Type::String);
        if (!name) FAIL("an event without a name");
        const auto thread = static_cast<std::int64_t>(tid->number);
        if (ph->text == "M") {
            if (name->text != "thread_name") continue;
            const Json* args = member(event, "args", Json::Type::Object);
            const Json* thread_name = args ? member(*args, "name", Json::Type::String) : nullptr;
            if (!thread_name || thread_name->text.empty()) FAIL("a thread_name event without args.name");
            trace.thread_names[thread] = thread_name->text;
            continue;
        }
        tids_used.insert(thread);
        const Json* ts = member(event, "ts", Json::Type::Number);
        if (!ts || ts->number < 0) FAIL("an event without ts, or before the start");
        if (ph->text == "X") {
            const Json* dur = member(event, "dur", Json::Type::Number);
            if (!dur || dur->number < 0) FAIL("an X event without dur >= 0");
            const Json* args = member(event, "args", Json::Type::Object);
            const Json* id = args ? member(*args, "id", Json::Type::Number) : nullptr;
            if (!id) FAIL("an X event without args.id");
            Slice slice{ts->number, ts->number + dur->number, static_cast<std::uint64_t>(id->number), name->text, "", "", ""};
            if (const Json* ended = member(*args, "ended", Json::Type::String)) slice.ended = ended->text;
            if (const Json* parked = member(*args, "parked", Json::Type::String)) slice.parked = parked->text;
            if (const Json* cat = member(event, "cat", Json::Type::String)) slice.cat = cat->text;
            trace.names.insert(slice.name);
            trace.slices[thread].push_back(slice);
        } else if (ph->text == "s" || ph->text == "f") {
            const Json* id = member(event, "id", Json::Type::Number);
            if (!id) FAIL("a flow event without id");
            ++(ph->text == "s" ? starts : finishes)[id->number];
            if (ph->text == "s") ++trace.flow_starts[thread];
        } else {
            FAIL("an event of an unexpected phase: " << ph->text);
        }
    }
    for (std::int64_t thread : tids_used) {
        CHECK_MESSAGE(trace.thread_names.count(thread) == 1, "tid " << thread << " has no thread_name");
    }
    // Per tid the slices nest or are disjoint (the recorder's never nest).
    for (auto& entry : trace.slices) {
        auto& slices = entry.second;
        std::stable_sort(slices.begin(), slices.end(), [](const Slice& a, const Slice& b) { return a.begin < b.begin; });
        // Times have 1 ns resolution (0.001 in the file); ts + dur in double may differ from
        // the next slice's ts in the last bits, so ends are compared to half a nanosecond.
        const double tolerance = 0.0005;
        std::vector<double> open_ends;  // the enclosing slices' ends, innermost last
        for (const Slice& slice : slices) {
            while (!open_ends.empty() && open_ends.back() <= slice.begin + tolerance) open_ends.pop_back();
            if (!open_ends.empty() && slice.end > open_ends.back() + tolerance) {
                FAIL_CHECK("tid " << entry.first << ": " << slice.name << " at " << slice.begin << " overlaps a slice ending at " << open_ends.back());
            }
            open_ends.push_back(slice.end);
        }
    }
    // Each flow start has exactly one finish with its id, and the reverse.
    for (const auto& start : starts) {
        if (start.second != 1) FAIL_CHECK("flow id " << start.first << " started " << start.second << " times");
        const auto finish = finishes.find(start.first);
        if (finish == finishes.end() || finish->second != 1) FAIL_CHECK("flow id " << start.first << " has no single finish");
    }
    for (const auto& finish : finishes) {
        if (starts.count(finish.first) != 1) FAIL_CHECK("flow id " << finish.first << " never started");
    }
    trace.flows = starts.size();
    return trace;
}

fsched::ScheduleTask named_task(std::string name, std::function<void()> fn) {
    fsched::ScheduleTask task;
    task.name = std::move(name);
    task.cb = std::move(fn);
    return task;
}

// A channel ping-pong between two named tasks and, `with_others`, a sleeper and a burst of
// short tasks, on `workers` workers; returns once they have all finished and the scheduler
// has stopped.
void ping_pong_with_sleeps(std::size_t workers, bool use_caller, int rounds, bool with_others = true) {
    Scheduler scheduler(workers, use_caller, "traced");
    scheduler.start();
    fsched::Channel<int> ping, pong;
    fsched::WaitGroup done(with_others ? 3 : 2);
    scheduler.schedule(named_task("pinger", [&] {
        for (int i = 0; i < rounds; ++i) {
            ping.send(i);
            pong.receive();
        }
        ping.close();
        done.done();
    }));
    scheduler.schedule(named_task("ponger", [&] {
        while (auto value = ping.receive()) pong.send(*value);
        done.done();
    }));
    if (with_others) {
        scheduler.schedule(named_task("sleeper", [&] {
            for (int i = 0; i < 3; ++i) fsched::this_fiber::sleep_for(std::chrono::milliseconds(1));
            done.done();
        }));
        for (int i = 0; i < 8; ++i) scheduler.schedule([] { fsched::this_fiber::yield(); });
    }
    if (use_caller) {
        scheduler.stop();  // the caller runs tasks until every one has ended
    } else {
        done.wait();
        scheduler.stop();
    }
}

}  // namespace

TEST_CASE("trace: a recording is valid Chrome Trace Event JSON with slices, names and flows") {
    for (const std::size_t workers : {2u, 3u}) {
        for (const bool use_caller : {false, true}) {
            CAPTURE(workers);
            CAPTURE(use_caller);
            TempFile file("trace_recording");
            REQUIRE(fsched::trace::start(file.path));
            ping_pong_with_sleeps(workers, use_caller, 200);
            fsched::trace::stop();
            const CheckedTrace trace = check_trace(file.path);
            CHECK(trace.mode == "recording");
            CHECK(trace.dropped == 0);
            CHECK(trace.names.count("pinger") == 1);
            CHECK(trace.names.count("ponger") == 1);
            CHECK(trace.names.count("sleeper") == 1);
            // Every round wakes the other side at least once: most of them show as arrows.
            CHECK(trace.flows >= 200);
            bool worker_named = false, parked = false, returned = false, on_channel = false, on_sleep = false;
            for (const auto& name : trace.thread_names) worker_named |= name.second.find("traced worker") == 0;
            for (const auto& entry : trace.slices) {
                for (const Slice& slice : entry.second) {
                    parked |= slice.name == "sleeper" && slice.ended == "parked";
                    returned |= slice.name == "sleeper" && slice.ended == "returned";
                    // A parked slice says what it parked on (the report's words).
                    on_sleep |= slice.name == "sleeper" && slice.ended == "parked" && slice.parked == "sleep";
                    on_channel |= slice.name == "pinger" && slice.ended == "parked" &&
                                  (slice.parked == "Channel send" || slice.parked == "Channel receive");
                }
            }
            CHECK(worker_named);
            CHECK(parked);
            CHECK(returned);
            CHECK(on_sleep);
            CHECK(on_channel);
        }
    }
}

TEST_CASE("trace: plain threads get a tid of their own, and a fiber resumed by hand nests none") {
    TempFile file("trace_plain");
    REQUIRE(fsched::trace::start(file.path));
    std::thread other([] {
        fsched::Fiber inner([] { fsched::Fiber::yield(); });
        fsched::Fiber outer([&inner] {
            inner.resume();  // the outer slice is closed around the inner one
            fsched::Fiber::yield();
            inner.resume();
        });
        outer.set_name("outer");
        inner.set_name("inner");
        outer.resume();
        outer.resume();
    });
    other.join();
    fsched::trace::stop();
    const CheckedTrace trace = check_trace(file.path);
    CHECK(trace.names.count("outer") == 1);
    CHECK(trace.names.count("inner") == 1);
    bool plain_named = false;
    for (const auto& name : trace.thread_names) plain_named |= name.second.find("thread ") == 0;
    CHECK(plain_named);
    std::size_t slices = 0;
    for (const auto& entry : trace.slices) slices += entry.second.size();
    CHECK(slices == 6);  // outer, inner, outer (yields), outer, inner (returns), outer
}

TEST_CASE("trace: a recording's cap drops events and counts them") {
    fsched::detail::set_trace_max_events(50);
    TempFile file("trace_capped");
    REQUIRE(fsched::trace::start(file.path));
    ping_pong_with_sleeps(2, false, 300);
    fsched::trace::stop();
    fsched::detail::set_trace_max_events(0);
    const CheckedTrace trace = check_trace(file.path);
    CHECK(trace.dropped > 0);
    for (const auto& entry : trace.slices) {
        // One recorded event each: a slice; a wake, written as its flow's start, and, when it
        // happened outside any slice (a timer or IO wake on a worker's loop), also as a
        // zero-length slice of category "wake", which is not an event of its own.
        std::size_t events = 0;
        for (const Slice& slice : entry.second) events += slice.cat == "wake" ? 0 : 1;
        const auto starts = trace.flow_starts.find(entry.first);
        if (starts != trace.flow_starts.end()) events += starts->second;
        CHECK(events <= 50);
    }
}

TEST_CASE("trace: the flight recorder keeps the newest n events per thread") {
    REQUIRE(fsched::trace::start_ring(16));
    // Only the two named fibers: each worker's newest events are theirs (the unnamed
    // yielders could otherwise run last on both workers).
    ping_pong_with_sleeps(2, false, 500, false);
    // The last thing recorded: a named task that runs once, after all the rest.
    {
        Scheduler scheduler(1, false, "last-sched");
        scheduler.start();
        fsched::WaitGroup done(1);
        scheduler.schedule(named_task("the-last-one", [&] { done.done(); }));
        done.wait();
        scheduler.stop();
    }
    TempFile file("trace_ring");
    REQUIRE(fsched::trace::dump(file.path));
    const CheckedTrace trace = check_trace(file.path);
    CHECK(trace.mode == "ring");
    CHECK(trace.names.count("the-last-one") == 1);
    CHECK(trace.names.count("pinger") + trace.names.count("ponger") >= 1);
    CHECK(trace.dropped > 0);  // overwritten
    bool some_full = false;
    for (const auto& entry : trace.slices) {
        std::size_t events = 0;
        for (const Slice& slice : entry.second) events += slice.cat == "fiber" && slice.ended != "running";
        const auto starts = trace.flow_starts.find(entry.first);
        if (starts != trace.flow_starts.end()) events += starts->second;
        CHECK(events <= 16);
        some_full |= events >= 8;
    }
    CHECK(some_full);
    // The ring goes on: a second dump works, and stop() ends it without writing a file.
    TempFile again("trace_ring_again");
    CHECK(fsched::trace::dump(again.path));
    fsched::trace::stop();
    CHECK_FALSE(fsched::trace::dump(again.path));
}

TEST_CASE("trace: misuse returns false and changes nothing") {
    fsched::trace::stop();  // nothing recording: harmless
    fsched::trace::stop();
    TempFile file("trace_misuse");
    CHECK_FALSE(fsched::trace::dump(file.path));  // no ring
    CHECK_FALSE(fsched::trace::start("no-such-directory-here/x/trace.json"));
    CHECK_FALSE(fsched::trace::start_ring(0));
    REQUIRE(fsched::trace::start(file.path));
    CHECK_FALSE(fsched::trace::start(file.path));  // twice
    CHECK_FALSE(fsched::trace::start_ring(8));
    CHECK_FALSE(fsched::trace::dump(file.path));  // a recording is not a ring
    fsched::trace::stop();
    check_trace(file.path);  // an empty recording is still a valid trace
    REQUIRE(fsched::trace::start_ring(8));
    CHECK_FALSE(fsched::trace::start(file.path));
    CHECK_FALSE(fsched::trace::start_ring(8));
    CHECK_FALSE(fsched::trace::dump("no-such-directory-here/x/trace.json"));
    fsched::trace::stop();
}

namespace {
// True when `text` is well-formed UTF-8 (what JSON text must be).
bool valid_utf8(const std::string& text) {
    for (std::size_t i = 0; i < text.size();) {
        const auto c = static_cast<unsigned char>(text[i]);
        std::size_t n = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : (c >> 3) == 0x1E ? 4 : 0;
        if (n == 0 || c == 0xC0 || c == 0xC1 || c > 0xF4 || i + n > text.size()) return false;
        for (std::size_t k = 1; k < n; ++k) {
            if ((static_cast<unsigned char>(text[i + k]) >> 6) != 0x2) return false;
        }
        i += n;
    }
    return true;
}
}  // namespace

TEST_CASE("trace: names that are not UTF-8 are written as U+FFFD, and the file stays valid UTF-8") {
    TempFile file("trace_utf8");
    REQUIRE(fsched::trace::start(file.path));
    fsched::Fiber bad([] {});
    bad.set_name(std::string("bad\xff\xfe-name-\xc3\xa9-\xe2\x82") + "-cut");  // é whole, € cut short
    bad.resume();
    fsched::Fiber good([] {});
    good.set_name("caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x99\x82");  // é, €, an emoji: kept as they are
    good.resume();
    fsched::trace::stop();
    const std::string text = read_whole_file(file.path);
    CHECK(valid_utf8(text));
    CHECK(text.find("bad\\ufffd\\ufffd-name-\xc3\xa9-\\ufffd\\ufffd-cut") != std::string::npos);
    CHECK(text.find("caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x99\x82") != std::string::npos);
    check_trace(file.path);
}

TEST_CASE("trace: FIBER_SCHED_TRACE_MAX_EVENTS takes digits only") {
    CHECK(fsched::detail::parse_event_count("5000") == 5000);
    CHECK(fsched::detail::parse_event_count("1") == 1);
    for (const char* bad : {"", "0", "-1", "+5", " 5", "5 ", "10x", "abc", "99999999999999999999999"}) {
        INFO(bad);
        CHECK(fsched::detail::parse_event_count(bad) == 0);
    }
    CHECK(fsched::detail::parse_event_count(nullptr) == 0);
}

TEST_CASE("trace: a ring larger than memory is refused, and a normal one starts after it") {
    CHECK_FALSE(fsched::trace::start_ring(std::size_t(1) << 58));
    CHECK_FALSE(fsched::trace::start_ring(SIZE_MAX));
    REQUIRE(fsched::trace::start_ring(8));
    fsched::trace::stop();
}

TEST_CASE("trace: a dump that cannot write takes nothing, and an exited thread's ring stays for the next dumps") {
    REQUIRE(fsched::trace::start_ring(32));
    std::thread([] {
        fsched::Fiber fiber([] {});
        fiber.set_name("exited-thread-fiber");
        fiber.resume();
    }).join();
    CHECK_FALSE(fsched::trace::dump("no-such-directory-here/x/ring.json"));
    TempFile first("trace_ring_after_failed_dump");
    REQUIRE(fsched::trace::dump(first.path));
    CHECK(check_trace(first.path).names.count("exited-thread-fiber") == 1);
    TempFile second("trace_ring_dumped_again");
    REQUIRE(fsched::trace::dump(second.path));
    CHECK(check_trace(second.path).names.count("exited-thread-fiber") == 1);
    fsched::trace::stop();
}

TEST_CASE("trace: a ring keeps the buffers of the newest 64 exited threads, not of every one") {
    // Each thread marks its buffer exited at its exit, through a thread_local's destructor;
    // with MinGW's emutls that destructor ran after the thread's thread_locals were freed,
    // found no buffer, and every exited thread's ring was kept (100 of 100 here).
    REQUIRE(fsched::trace::start_ring(32));
    for (int i = 0; i < 100; ++i) {
        std::thread([] {
            fsched::Fiber fiber([] {});
            fiber.resume();
        }).join();
    }
    TempFile file("trace_ring_exited_threads");
    REQUIRE(fsched::trace::dump(file.path));
    fsched::trace::stop();
    const CheckedTrace trace = check_trace(file.path);
    CHECK(trace.thread_names.size() >= 64);
    CHECK(trace.thread_names.size() <= 65);  // and this thread's, had it recorded
}

TEST_CASE("trace: stop() while fibers end on other threads reads none of them (ASan, TSan)") {
    // stop() clears the trace bit first; a fiber that ends after that takes no trace lock,
    // and its slice may still show open: stop() must not read the freed fiber for its name.
    std::atomic<bool> done{false};
    std::atomic<long> made{0};
    std::vector<std::thread> makers;
    for (int t = 0; t < 2; ++t) {
        makers.emplace_back([&] {
            while (!done.load(std::memory_order_relaxed)) {
                auto fiber = std::make_shared<fsched::Fiber>([] {
                    for (volatile int i = 0; i < 100; ++i) {
                    }
                });
                fiber->set_name("short-lived");
                fiber->resume();
                made.fetch_add(1, std::memory_order_relaxed);
            }
        });
    }
    const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(400);
    long cycles = 0;
    while (std::chrono::steady_clock::now() < until || cycles < 100) {
        REQUIRE(fsched::trace::start_ring(16));
        fsched::trace::stop();
        ++cycles;
    }
    done = true;
    for (auto& t : makers) t.join();
    CHECK(made.load() > 0);
}

TEST_CASE("trace: start, stop and dump from another thread while fibers switch") {
    Scheduler scheduler(3, false, "busy");
    scheduler.start();
    std::atomic<bool> stopping{false};
    std::atomic<std::uint64_t> yields{0};
    fsched::WaitGroup done(6);
    for (int i = 0; i < 6; ++i) {
        scheduler.schedule(named_task("spinner", [&] {
            while (!stopping.load(std::memory_order_relaxed)) {
                yields.fetch_add(1, std::memory_order_relaxed);
                fsched::this_fiber::yield();
            }
            done.done();
        }));
    }
    // Until the spinners have switched `n` more times (a loaded machine may hold every worker
    // off the CPU for a while), or 10 s.
    auto switches_seen = [&yields](std::uint64_t n) {
        const std::uint64_t from = yields.load();
        const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
        while (yields.load() - from < n && std::chrono::steady_clock::now() < deadline) std::this_thread::yield();
    };
    // Short-lived threads too: their buffers outlive them until a stop() or dump() takes them.
    // (A cap keeps the files small: the spinners switch a million times a second.)
    fsched::detail::set_trace_max_events(5000);
    TempFile file("trace_concurrent");
    for (int round = 0; round < 10; ++round) {
        REQUIRE(fsched::trace::start(file.path));
        std::thread brief([] {
            fsched::Fiber fiber([] {});
            fiber.resume();
        });
        brief.join();
        switches_seen(100);
        fsched::trace::stop();
        const CheckedTrace trace = check_trace(file.path);
        CHECK(trace.names.count("spinner") == 1);
        REQUIRE(fsched::trace::start_ring(64));
        switches_seen(100);
        CHECK(fsched::trace::dump(file.path));
        fsched::trace::stop();
        check_trace(file.path);
    }
    fsched::detail::set_trace_max_events(0);
    stopping = true;
    done.wait();
    scheduler.stop();
}

namespace {
std::atomic<int> hook_switch_ins{0};
}

TEST_CASE("trace: the profiler hooks still run while a trace records") {
    fsched::Hooks hooks;
    hooks.on_switch_in = [](fsched::Fiber&, int) { hook_switch_ins.fetch_add(1, std::memory_order_relaxed); };
    fsched::set_hooks(hooks);
    TempFile file("trace_hooks");
    REQUIRE(fsched::trace::start(file.path));
    fsched::Fiber fiber([] { fsched::Fiber::yield(); });
    fiber.set_name("hooked");
    fiber.resume();
    fiber.resume();
    fsched::set_hooks(fsched::Hooks{});  // clears the hooks' bit only: the trace goes on
    fsched::Fiber after([] {});
    after.set_name("after-hooks");
    after.resume();
    fsched::trace::stop();
    CHECK(hook_switch_ins.load() == 2);
    const CheckedTrace trace = check_trace(file.path);
    CHECK(trace.names.count("hooked") == 1);
    CHECK(trace.names.count("after-hooks") == 1);
}
