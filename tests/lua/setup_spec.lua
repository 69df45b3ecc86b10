-- setup_spec.lua: scripts/setup.sh --check judges the packages of this
-- machine's own architecture. A fake dpkg and dpkg-query on PATH stand for a
-- machine in a given state (what scripts/test-aarch64.sh leaves: the :arm64
-- cross packages installed, the native ones missing, say).

local helper = require("helper")

local SETUP = helper.root .. "/scripts/setup.sh"
local NEEDED = { "build-essential", "cmake", "luajit", "libluajit-5.1-dev", "libopenblas-dev",
    "libcjson-dev", "libedit-dev", "lua-busted", "openmpi-bin", "libopenmpi-dev",
    -- asked for only where the command is missing
    "curl", "nodejs", "npm" }

-- A folder with dpkg (native architecture amd64) and a dpkg-query that
-- answers from `state`: package name -> list of architectures it is
-- installed for ("amd64", "arm64", "all").
local function fake_dpkg(dir, state)
    local lines = {}
    for name, arches in pairs(state) do
        for _, arch in ipairs(arches) do
            lines[#lines + 1] = name .. " " .. arch
        end
    end
    helper.write_file(dir .. "/state", table.concat(lines, "\n") .. "\n")
    helper.write_file(dir .. "/dpkg", "#!/bin/sh\n[ \"$1\" = --print-architecture ] && echo amd64\n")
    -- dpkg-query -W -f=FORMAT NAME: one "Status Architecture" line per instance
    helper.write_file(dir .. "/dpkg-query", ([[#!/bin/sh
name=$3
found=1
while read -r pkg arch; do
    [ "$pkg" = "$name" ] || continue
    echo "install ok installed $arch"
    found=0
done < %s
[ $found -eq 0 ] || { echo "dpkg-query: no packages found matching $name" >&2; exit 1; }
]]):format(helper.q(dir .. "/state")))
    os.execute("chmod +x " .. helper.q(dir .. "/dpkg") .. " " .. helper.q(dir .. "/dpkg-query"))
end

local function check(dir)
    return helper.run(("PATH=%s:$PATH sh %s --check"):format(helper.q(dir), helper.q(SETUP)))
end

describe("scripts/setup.sh --check", function()
    local dir
    before_each(function() dir = helper.tmpdir() end)
    after_each(function() helper.rmdir(dir) end)

    it("counts a package only when it is installed for the native architecture", function()
        local state = {}
        for _, name in ipairs(NEEDED) do state[name] = { name == "lua-busted" and "all" or "amd64" } end
        -- the cross packages of scripts/test-aarch64.sh, with the native ones missing
        state["libopenblas-dev"] = { "arm64" }
        state["libcjson-dev"] = { "arm64" }
        fake_dpkg(dir, state)
        local rc, out = check(dir)
        print(("  arm64-only openblas and cjson: exit %d, %s"):format(rc, (out:gsub("\n+$", ""))))
        assert.are.equal(1, rc)
        assert.truthy(out:find("missing Debian packages (for amd64): libopenblas-dev libcjson-dev", 1, true))
        assert.falsy(out:find("all dependencies are installed", 1, true))
    end)

    it("accepts native and architecture-independent packages beside cross ones", function()
        local state = {}
        for _, name in ipairs(NEEDED) do state[name] = { name == "lua-busted" and "all" or "amd64" } end
        state["libopenblas-dev"] = { "arm64", "amd64" }
        fake_dpkg(dir, state)
        local rc, out = check(dir)
        assert.are.equal(0, rc, out)
        assert.truthy(out:find("all dependencies are installed for amd64", 1, true))
    end)

    it("reports a package that is not installed at all", function()
        local state = {}
        for _, name in ipairs(NEEDED) do state[name] = { "amd64" } end
        state["cmake"] = nil
        fake_dpkg(dir, state)
        local rc, out = check(dir)
        assert.are.equal(1, rc)
        assert.truthy(out:find("missing Debian packages (for amd64): cmake", 1, true), out)
    end)
end)
