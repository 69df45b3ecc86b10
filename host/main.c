/*
 * main.c - the `cartridge` executable: a LuaJIT host with the engine linked in.
 *
 *   cartridge                    the REPL (lua/cartridge/repl.lua)
 *   cartridge run FILE [ARGS]    run a recipe; FILE may name one in <home>/recipes
 *   cartridge -e CODE [ARGS]     run a chunk of Lua code
 *   cartridge - [ARGS]           run a chunk read from stdin
 *
 * The executable links libcartridge and libedit, so the engine's symbols and
 * readline() are in LuaJIT's ffi.C. Before running anything the host prepends
 * <home>/lua to package.path and registers package.loaded["cartridge.host"] =
 * { home, version, executable, library }, which tells the FFI loader where the
 * headers are (<home>/engine) and that it runs inside this host.
 *
 * Exit status: 0 on success, 1 on a Lua error or a missing script, 2 on bad
 * usage, 130 when SIGINT interrupted the Lua code. os.exit() works as usual.
 *
 * MPI: the host never initializes it. A recipe that trains across processes
 * joins the job it was launched in (cartridge.dist, engine/dist.h: only
 * under mpirun, mpiexec or srun); the host then leaves MPI at the end, and an
 * error on one rank stops the whole job naming that rank (see report()).
 */
#include <errno.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <lua.h>
#include <lauxlib.h>
#include <lualib.h>
#include <luajit.h>

#include "common.h"
#include "cpu.h"
#include "dist.h"

#ifndef CART_VERSION_STRING
#define CART_VERSION_STRING "0.0.0"
#endif
#ifndef CART_SOURCE_DIR
#define CART_SOURCE_DIR "."
#endif

enum {
    EXIT_LUA_ERROR = 1,
    EXIT_USAGE = 2,
    EXIT_INTERRUPTED = 130, /* 128 + SIGINT, what a shell reports for Ctrl-C */
};

/* Where the host found what it needs; filled once in main(). */
typedef struct host_paths {
    char home[PATH_MAX];       /* holds lua/, recipes/, engine/ */
    char executable[PATH_MAX]; /* absolute path of this program when known */
} host_paths;

/* ------------------------------------------------------------------------- */
/* Small file-system helpers. */

static int is_dir(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

static int is_file(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

/* Writes "<a><b>" into out (cap bytes). Returns 0, or -1 when it would not
 * fit (out then holds an empty string). */
static int join_path(char *out, size_t cap, const char *a, const char *b) {
    int n = snprintf(out, cap, "%s%s", a, b);
    if (n < 0 || (size_t)n >= cap) {
        out[0] = '\0';
        return -1;
    }
    return 0;
}

/* Fills paths->executable with /proc/self/exe, or argv0 made absolute when
 * that fails, or argv0 as given. Always leaves a NUL-terminated string. */
static void find_executable(host_paths *paths, const char *argv0) {
    ssize_t n = readlink("/proc/self/exe", paths->executable, sizeof paths->executable - 1);
    if (n > 0) {
        paths->executable[n] = '\0';
        return;
    }
    if (strchr(argv0, '/') && realpath(argv0, paths->executable)) return;
    snprintf(paths->executable, sizeof paths->executable, "%s", argv0);
}

/* Fills paths->home: $CARTRIDGE_HOME when set and non-empty; else
 * <dir of executable>/../share/cartridge when it holds lua/cartridge (an
 * installed tree); else the source tree this binary was built from. */
static void find_home(host_paths *paths) {
    const char *env = getenv("CARTRIDGE_HOME");
    if (env && env[0]) {
        snprintf(paths->home, sizeof paths->home, "%s", env);
        size_t len = strlen(paths->home);
        while (len > 1 && paths->home[len - 1] == '/') paths->home[--len] = '\0';
        return;
    }
    char dir[PATH_MAX], candidate[PATH_MAX], probe[PATH_MAX];
    snprintf(dir, sizeof dir, "%s", paths->executable);
    char *slash = strrchr(dir, '/');
    if (slash) {
        *slash = '\0';
        if (join_path(candidate, sizeof candidate, dir, "/../share/cartridge") == 0 &&
            join_path(probe, sizeof probe, candidate, "/lua/cartridge") == 0 && is_dir(probe) &&
            realpath(candidate, paths->home))
            return;
    }
    snprintf(paths->home, sizeof paths->home, "%s", CART_SOURCE_DIR);
}

/* Resolves the FILE of `cartridge run FILE` into out (cap bytes). FILE itself
 * when it is a file; otherwise, when FILE has no '/', <home>/recipes/FILE and
 * then <home>/recipes/FILE.lua. Returns 0 when found, -1 when not (out then
 * holds FILE, so the loader's "cannot open" message names what was asked). */
static int resolve_script(char *out, size_t cap, const char *name, const char *home) {
    snprintf(out, cap, "%s", name);
    if (is_file(name)) return 0;
    if (strchr(name, '/')) return -1;
    char plain[PATH_MAX], with_ext[PATH_MAX];
    if (snprintf(plain, sizeof plain, "%s/recipes/%s", home, name) >= (int)sizeof plain) return -1;
    if (is_file(plain)) {
        snprintf(out, cap, "%s", plain);
        return 0;
    }
    if (join_path(with_ext, sizeof with_ext, plain, ".lua") == 0 && is_file(with_ext)) {
        snprintf(out, cap, "%s", with_ext);
        return 0;
    }
    return -1;
}

/* ------------------------------------------------------------------------- */
/* SIGINT: the handler sets a hook, the hook raises "interrupted" the next
 * time the interpreter runs. A second Ctrl-C before that (Lua stuck in a C
 * call or in a JIT-compiled loop, which does not run hooks) kills the
 * process. Same scheme as lua.c and luajit.c. */

static lua_State *interrupt_state = NULL;
static volatile sig_atomic_t interrupt_raised = 0;

static void on_sigint(int sig);

static void arm_sigint(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_sigint;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
}

static void disarm_sigint(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = SIG_DFL;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
}

static void interrupt_hook(lua_State *L, lua_Debug *ar) {
    (void)ar;
    lua_sethook(L, NULL, 0, 0);
    arm_sigint(); /* Lua is back in control: the next Ctrl-C interrupts again */
    interrupt_raised = 1;
    lua_pushliteral(L, "interrupted");
    lua_error(L);
}

static void on_sigint(int sig) {
    (void)sig;
    disarm_sigint();
    if (interrupt_state)
        lua_sethook(interrupt_state, interrupt_hook, LUA_MASKCALL | LUA_MASKRET | LUA_MASKCOUNT, 1);
}

static int traceback_wanted(void) {
    const char *env = getenv("CARTRIDGE_TRACEBACK");
    return env && env[0] && strcmp(env, "0") != 0;
}

/* Message handler for lua_pcall. String errors stay as they are (they are
 * meant for the user: "unknown flag --x (see --help)"), unless
 * CARTRIDGE_TRACEBACK is set. Any other error object becomes a string (its
 * __tostring, or a note of its type) followed by a traceback. */
static int message_handler(lua_State *L) {
    const char *msg = lua_tostring(L, 1);
    if (msg && lua_type(L, 1) == LUA_TSTRING) {
        if (!traceback_wanted()) return 1;
    } else if (luaL_callmeta(L, 1, "__tostring") && lua_type(L, -1) == LUA_TSTRING) {
        msg = lua_tostring(L, -1);
    } else {
        msg = lua_pushfstring(L, "(error object is a %s value)", luaL_typename(L, 1));
    }
    luaL_traceback(L, L, msg, 1);
    return 1;
}

/* Calls the function below its nargs arguments on the stack, with the
 * message handler and SIGINT armed. Returns lua_pcall's status; on failure
 * the (string) message is on the stack. */
static int docall(lua_State *L, int nargs) {
    int base = lua_gettop(L) - nargs;
    lua_pushcfunction(L, message_handler);
    lua_insert(L, base);
    interrupt_state = L;
    arm_sigint();
    int status = lua_pcall(L, nargs, 0, base);
    disarm_sigint();
    interrupt_state = NULL;
    lua_remove(L, base);
    return status;
}

/* Prints "cartridge: <message>" for a failed load or call and returns the
 * exit status that goes with it. Pops the message.
 * In a job of several processes (engine/dist.h; a recipe joined it): an
 * error every rank raised together is printed by rank 0 alone, and the
 * caller ends normally on every rank; any other error names its rank and
 * stops the whole job here (MPI_Abort), since the other ranks may be
 * waiting for this one in a collective. */
static int report(lua_State *L, int status) {
    if (status == 0) return 0;
    const char *msg = lua_tostring(L, -1);
    if (!msg) msg = "(error object is not a string)";
    int code = interrupt_raised ? EXIT_INTERRUPTED : EXIT_LUA_ERROR;
    if (cart_dist_size() > 1 && !cart_dist_failing_together()) {
        cart_dist_abort(code, msg); /* does not return */
    } else if (cart_dist_rank() == 0) {
        fprintf(stderr, "cartridge: %s\n", msg);
        fflush(stderr);
    }
    lua_pop(L, 1);
    return code;
}

/* ------------------------------------------------------------------------- */
/* State setup. */

typedef struct setup_args {
    const host_paths *paths;
    char **argv;
    int argc;
    int script_index;        /* argv index that becomes arg[0]; < 0: no arg table args */
    const char *script_path; /* replaces argv[script_index] in arg[0] when set */
} setup_args;

/* Runs under lua_cpcall, so running out of memory here is a Lua error, not
 * a panic. Opens the libraries, puts <home>/lua first on package.path,
 * registers cartridge.host and builds the global `arg` table. */
static int setup_state(lua_State *L) {
    const setup_args *a = (const setup_args *)lua_touserdata(L, 1);
    lua_settop(L, 0);
    luaL_openlibs(L);

    lua_getglobal(L, "package");
    lua_getfield(L, -1, "path");
    const char *old_path = lua_tostring(L, -1);
    lua_pushfstring(L, "%s/lua/?.lua;%s/lua/?/init.lua;%s", a->paths->home, a->paths->home,
                    old_path ? old_path : "");
    lua_setfield(L, -3, "path");
    lua_pop(L, 1); /* old path */

    lua_getfield(L, -1, "loaded");
    lua_createtable(L, 0, 4);
    lua_pushstring(L, a->paths->home);
    lua_setfield(L, -2, "home");
    lua_pushstring(L, CART_VERSION_STRING);
    lua_setfield(L, -2, "version");
    lua_pushstring(L, a->paths->executable);
    lua_setfield(L, -2, "executable");
#ifdef CART_LIBRARY_NAME
    lua_pushstring(L, CART_LIBRARY_NAME);
    lua_setfield(L, -2, "library");
#endif
    lua_setfield(L, -2, "cartridge.host");
    lua_pop(L, 2); /* loaded, package */

    /* arg[i] = argv[script_index + i], as luajit does: arg[0] is the script,
     * negative indices are what came before it. */
    int first = a->script_index >= 0 ? a->script_index : 0;
    lua_createtable(L, a->argc - first, first + 1);
    for (int i = 0; i < a->argc; i++) {
        const char *s = (i == first && a->script_path) ? a->script_path : a->argv[i];
        lua_pushstring(L, s);
        lua_rawseti(L, -2, i - first);
    }
    lua_setglobal(L, "arg");
    return 0;
}

/* Pushes argv[from..argc-1] as chunk arguments; returns how many. */
static int push_args(lua_State *L, char **argv, int argc, int from) {
    int n = from < argc ? argc - from : 0;
    luaL_checkstack(L, n + 1, "too many arguments to the script");
    for (int i = 0; i < n; i++) lua_pushstring(L, argv[from + i]);
    return n;
}

/* ------------------------------------------------------------------------- */
/* Usage. */

static void print_usage(FILE *out, const host_paths *paths) {
    fprintf(out,
            "usage: cartridge [COMMAND] [ARGS...]\n"
            "\n"
            "commands:\n"
            "  cartridge                 open the REPL (=expr prints; Ctrl-D exits). When stdin\n"
            "                            is not a terminal it reads lines from it, no prompts\n"
            "  cartridge repl            open the REPL\n"
            "  cartridge run FILE [ARGS] run a Lua recipe. A FILE that does not exist and has no\n"
            "                            '/' is looked up as <home>/recipes/FILE[.lua], so\n"
            "                            `cartridge run inspect model.gguf` works. Recipes take\n"
            "                            --help\n"
            "  cartridge -e CODE [ARGS]  run a chunk of Lua code\n"
            "  cartridge - [ARGS]        run a chunk of Lua code read from stdin\n"
            "  cartridge --help, -h      print this help\n"
            "  cartridge --version, -v   print the version\n"
            "\n"
            "Scripts see their ARGS as ... and in the global `arg` table, as luajit sets it\n"
            "(arg[0] is the script, arg[1..n] the ARGS). A Lua error prints\n"
            "\"cartridge: <message>\" and exits 1; Ctrl-C interrupts Lua code (exit 130), a\n"
            "second Ctrl-C kills it.\n"
            "\n"
            "environment:\n"
            "  CARTRIDGE_HOME       directory holding lua/, recipes/ and engine/\n"
            "  CARTRIDGE_TRACEBACK  set to 1 to print a Lua traceback with every error\n"
            "  CARTRIDGE_HISTORY    REPL history file (default ~/.cartridge_history)\n"
            "\n"
            "home is $CARTRIDGE_HOME, else <dir of the executable>/../share/cartridge when it\n"
            "holds lua/cartridge, else the source tree the executable was built from.\n"
            "home now: %s\n",
            paths->home);
}

static int usage_error(const char *what, const char *arg) {
    fprintf(stderr, "cartridge: %s%s%s%s\n", what, arg ? " '" : "", arg ? arg : "", arg ? "'" : "");
    fprintf(stderr, "Try 'cartridge --help' for usage.\n");
    return EXIT_USAGE;
}

static const char *luajit_version(void) {
    const char *v = LUAJIT_VERSION;
    return strncmp(v, "LuaJIT ", 7) == 0 ? v + 7 : v;
}

/* ------------------------------------------------------------------------- */

typedef enum mode { MODE_REPL, MODE_RUN, MODE_CHUNK, MODE_STDIN } mode;

/* `cartridge --version`: the version, LuaJIT's, and the kernels. */
static int print_version(void) {
    if (cart_isa_init() != CART_OK) {
        fprintf(stderr, "cartridge: %s\n", cart_last_error());
        return EXIT_LUA_ERROR;
    }
    printf("cartridge %s (LuaJIT %s; kernels: %s, best here: %s; %s)\n", CART_VERSION_STRING,
           luajit_version(), cart_isa_name(cart_isa_active()), cart_isa_name(cart_isa_best()),
           cart_cpu_features());
    return 0;
}

/* The command in argv[1]: sets *m and *script_index (the argv index of
 * arg[0], -1 for the REPL) and returns -1 to go on, or the exit code of a
 * command that is done (help, version) or wrong. */
static int parse_command(int argc, char **argv, const host_paths *paths, mode *m, int *script_index) {
    const char *cmd = argc > 1 ? argv[1] : NULL;
    *m = MODE_REPL;
    *script_index = -1;
    if (!cmd || strcmp(cmd, "repl") == 0) {
        if (argc > 2) return usage_error("the REPL takes no arguments, got", argv[2]);
    } else if (strcmp(cmd, "--help") == 0 || strcmp(cmd, "-h") == 0) {
        print_usage(stdout, paths);
        return 0;
    } else if (strcmp(cmd, "--version") == 0 || strcmp(cmd, "-v") == 0) {
        return print_version();
    } else if (strcmp(cmd, "run") == 0) {
        if (argc < 3) return usage_error("run needs a FILE (a script or a recipe name)", NULL);
        *m = MODE_RUN, *script_index = 2;
    } else if (strcmp(cmd, "-e") == 0) {
        if (argc < 3) return usage_error("-e needs a chunk of Lua code", NULL);
        *m = MODE_CHUNK, *script_index = 2;
    } else if (strcmp(cmd, "-") == 0) {
        *m = MODE_STDIN, *script_index = 1;
    } else if (cmd[0] == '-') {
        return usage_error("unknown option", cmd);
    } else {
        fprintf(stderr, "cartridge: unknown command '%s' (to run a script: cartridge run %s)\n",
                cmd, cmd);
        fprintf(stderr, "Try 'cartridge --help' for usage.\n");
        return EXIT_USAGE;
    }
    return -1;
}

/* Loads what mode m runs (the script, the chunk, stdin or the REPL) and
 * runs it with the arguments after script_index; returns the exit code. */
static int run_mode(lua_State *L, mode m, const char *script, char **argv, int argc, int script_index) {
    int status = 0, nargs = 0;
    switch (m) {
    case MODE_RUN:
        status = luaL_loadfile(L, script);
        break;
    case MODE_CHUNK:
        status = luaL_loadbuffer(L, argv[2], strlen(argv[2]), "=(command line)");
        break;
    case MODE_STDIN:
        status = luaL_loadfile(L, NULL);
        break;
    case MODE_REPL: {
        static const char repl[] = "return require('cartridge.repl').run()";
        status = luaL_loadbuffer(L, repl, sizeof repl - 1, "=repl");
        break;
    }
    }
    if (status == 0) {
        if (m != MODE_REPL) nargs = push_args(L, argv, argc, script_index + 1);
        status = docall(L, nargs);
    }
    return report(L, status);
}

int main(int argc, char **argv) {
    host_paths paths;
    find_executable(&paths, argc > 0 ? argv[0] : "cartridge");
    find_home(&paths);

    mode m;
    int script_index;
    int done = parse_command(argc, argv, &paths, &m, &script_index);
    if (done >= 0) return done;

    /* a CART_ISA this machine cannot run stops here, before any work */
    if (cart_isa_init() != CART_OK) {
        fprintf(stderr, "cartridge: %s\n", cart_last_error());
        return EXIT_LUA_ERROR;
    }

    char script[PATH_MAX] = "";
    if (m == MODE_RUN && resolve_script(script, sizeof script, argv[2], paths.home) != 0) {
        if (strchr(argv[2], '/'))
            fprintf(stderr, "cartridge: cannot find script '%s'\n", argv[2]);
        else
            fprintf(stderr,
                    "cartridge: cannot find script '%s' (also looked for %s/recipes/%s and "
                    "%s/recipes/%s.lua)\n",
                    argv[2], paths.home, argv[2], paths.home, argv[2]);
        return EXIT_LUA_ERROR;
    }

    lua_State *L = luaL_newstate();
    if (!L) {
        fprintf(stderr, "cartridge: cannot create a Lua state (out of memory)\n");
        return EXIT_LUA_ERROR;
    }
    setup_args setup = {&paths, argv, argc, script_index, m == MODE_RUN ? script : NULL};
    if (script_index < 0) {
        /* REPL: arg = { [0] = the executable }, like luajit without a script */
        setup.argc = argc > 0 ? 1 : 0;
        setup.script_index = 0;
    }
    int code = report(L, lua_cpcall(L, setup_state, &setup));
    if (code != 0) {
        lua_close(L);
        return code;
    }
    code = run_mode(L, m, script, argv, argc, script_index);
    lua_close(L);
    /* leaves MPI when a recipe joined a job (every rank gets here) */
    if (cart_dist_finalize() != CART_OK && code == 0) {
        fprintf(stderr, "cartridge: %s\n", cart_last_error());
        code = EXIT_LUA_ERROR;
    }
    return code;
}
