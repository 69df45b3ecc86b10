/*
 * lua_harness.c - the one libFuzzer harness behind the Lua targets
 * (fuzz_cartridge, fuzz_request, fuzz_template).
 *
 * Each target is this file compiled with FUZZ_LUA_TARGET naming a Lua file in
 * tests/fuzz/ and linked with the whole engine, its symbols exported
 * (-rdynamic), so that lua/cartridge/core.lua binds to the engine inside the
 * executable through ffi.C, as it does in the `cartridge` host
 * (host/main.c): the harness puts <home>/lua and <home>/tests/fuzz on
 * package.path and registers package.loaded["cartridge.host"].
 *
 * The target file returns a function that takes one input as a Lua string
 * (or a table with such a `run` function). It catches the rejections it
 * expects itself; anything that escapes it is a finding: the harness prints
 * the error with a traceback and calls abort(), which libFuzzer reports as a
 * crash and saves the input.
 *
 * Coverage: libFuzzer's instrumentation sees the C code only, so the
 * harness also reports Lua's: a line hook turns each step from one Lua line
 * to the next (source, line) into a hit in an extra counter array
 * (__libfuzzer_extra_counters), and inputs that reach new Lua lines and
 * branches join the corpus. The JIT is off so that every line runs in the
 * interpreter and calls the hook. CART_FUZZ_LUA_COVERAGE=0 turns both off.
 *
 * Leaks: the Lua state allocates through malloc (lua_newstate; LuaJIT's GC64
 * mode allows a custom allocator) and marks each of its blocks with
 * __lsan_ignore_object. LeakSanitizer then never reports Lua's own memory
 * (GC64 keeps object references NaN-tagged, which it cannot follow) but
 * scans it as a root, so an engine object that a Lua value points to counts
 * as reachable, and one that nothing points to is still a leak.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <lauxlib.h>
#include <lua.h>
#include <luajit.h>
#include <lualib.h>
#include <sanitizer/lsan_interface.h>

#ifndef CART_SOURCE_DIR
#define CART_SOURCE_DIR "."
#endif
#ifndef CART_VERSION_STRING
#define CART_VERSION_STRING "0.0.0"
#endif
#ifndef FUZZ_LUA_TARGET
#error "FUZZ_LUA_TARGET must name the target's Lua file (without .lua)"
#endif

static lua_State *L;
static int run_ref = LUA_NOREF;

enum { LUA_COUNTERS = 1 << 16 };
__attribute__((section("__libfuzzer_extra_counters"))) static uint8_t lua_counters[LUA_COUNTERS];
static uint32_t previous_line;

/* Counts the step from the previous line to this one, AFL-style. */
static void line_hook(lua_State *S, lua_Debug *ar) {
    if (!lua_getinfo(S, "S", ar)) return;
    uint64_t h = (uint64_t)(uintptr_t)ar->source * 0x9E3779B97F4A7C15ULL;
    uint32_t here = (uint32_t)(h >> 32) ^ (uint32_t)ar->currentline * 0x85EBCA6BU;
    uint8_t *c = &lua_counters[(here ^ previous_line) % LUA_COUNTERS];
    if (*c < 255) (*c)++;
    previous_line = here >> 1;
}

static void *allocate(void *ud, void *ptr, size_t osize, size_t nsize) {
    (void)ud;
    (void)osize;
    if (nsize == 0) {
        free(ptr);
        return NULL;
    }
    void *p = realloc(ptr, nsize);
    if (p) __lsan_ignore_object(p);
    return p;
}

/* Message handler: any error value becomes text with a traceback. */
static int traceback(lua_State *S) {
    const char *msg = lua_tostring(S, 1);
    if (!msg || lua_type(S, 1) != LUA_TSTRING) {
        if (luaL_callmeta(S, 1, "__tostring") && lua_type(S, -1) == LUA_TSTRING)
            msg = lua_tostring(S, -1);
        else
            msg = lua_pushfstring(S, "(error object is a %s value)", luaL_typename(S, 1));
    }
    luaL_traceback(S, S, msg, 1);
    return 1;
}

static void die(const char *what) {
    fprintf(stderr, "\n%s: %s: %s\n", FUZZ_LUA_TARGET, what, lua_tostring(L, -1));
    fflush(stderr);
    abort();
}

/* Sets up package.path and cartridge.host, then loads the target file. */
static int setup(lua_State *S) {
    const char *home = (const char *)lua_touserdata(S, 1);
    lua_settop(S, 0);
    luaL_openlibs(S);
    lua_getglobal(S, "package");
    lua_getfield(S, -1, "path");
    lua_pushfstring(S, "%s/lua/?.lua;%s/lua/?/init.lua;%s/tests/fuzz/?.lua;%s", home, home, home,
                    lua_tostring(S, -1));
    lua_setfield(S, -3, "path");
    lua_pop(S, 1);
    lua_getfield(S, -1, "loaded");
    lua_createtable(S, 0, 4);
    lua_pushstring(S, home);
    lua_setfield(S, -2, "home");
    lua_pushstring(S, CART_VERSION_STRING);
    lua_setfield(S, -2, "version");
    lua_pushstring(S, "/proc/self/exe");
    lua_setfield(S, -2, "executable");
    lua_pushstring(S, FUZZ_LUA_TARGET);
    lua_setfield(S, -2, "fuzz_target");
    lua_setfield(S, -2, "cartridge.host");
    lua_pop(S, 2);
    return 0;
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    const char *home = getenv("CARTRIDGE_HOME");
    if (!home || !home[0]) home = CART_SOURCE_DIR;
    L = lua_newstate(allocate, NULL);
    if (!L) {
        fprintf(stderr, "%s: cannot create a Lua state\n", FUZZ_LUA_TARGET);
        abort();
    }
    if (lua_cpcall(L, setup, (void *)home) != 0) die("setup failed");
    const char *cov = getenv("CART_FUZZ_LUA_COVERAGE");
    if (!cov || strcmp(cov, "0") != 0) {
        luaJIT_setmode(L, 0, LUAJIT_MODE_ENGINE | LUAJIT_MODE_OFF);
        lua_sethook(L, line_hook, LUA_MASKLINE, 0);
    }

    char path[4096];
    snprintf(path, sizeof path, "%s/tests/fuzz/%s.lua", home, FUZZ_LUA_TARGET);
    lua_pushcfunction(L, traceback);
    if (luaL_loadfile(L, path) != 0) die("cannot load the target");
    if (lua_pcall(L, 0, 1, 1) != 0) die("the target failed to initialize");
    if (lua_istable(L, -1)) lua_getfield(L, -1, "run");
    if (!lua_isfunction(L, -1)) {
        lua_pushfstring(L, "%s returned no function (or table with a run function)", path);
        die("bad target");
    }
    run_ref = luaL_ref(L, LUA_REGISTRYINDEX);
    lua_settop(L, 0);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    lua_pushcfunction(L, traceback);
    lua_rawgeti(L, LUA_REGISTRYINDEX, run_ref);
    lua_pushlstring(L, (const char *)data, size);
    if (lua_pcall(L, 1, 0, 1) != 0) die("finding");
    lua_settop(L, 0);
    return 0;
}
