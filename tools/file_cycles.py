#!/usr/bin/env python3
"""file_cycles.py OBJDIR: the engine's C files that call each other in a loop.

Reads every object file under OBJDIR (the cartridge_objects library of a
build: build/CMakeFiles/cartridge_objects.dir) with nm, links each undefined
symbol to the file that defines it, and prints each set of files that reach
themselves through the files they call (a strongly connected component of
more than one file), with the symbols on its edges. Exits 1 when there is
one, 0 when none, 2 when nothing could be read.
"""
import collections
import pathlib
import subprocess
import sys


def graph(objdir):
    defs, uses = {}, collections.defaultdict(set)
    objs = sorted(pathlib.Path(objdir).rglob("*.o"))
    for o in objs:
        name = str(o.relative_to(objdir))[:-2]
        out = subprocess.run(["nm", str(o)], capture_output=True, text=True, check=True).stdout
        for line in out.splitlines():
            p = line.split()
            if len(p) == 3 and p[1] in "TDBR":
                defs[p[2]] = name
            elif len(p) == 2 and p[0] == "U":
                uses[name].add(p[1])
    edges = collections.defaultdict(lambda: collections.defaultdict(list))
    for f, syms in uses.items():
        for s in syms:
            if s in defs and defs[s] != f:
                edges[f][defs[s]].append(s)
    return objs, edges


def components(edges):
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in list(edges):
        if v not in index:
            visit(v)
    return out


def main():
    if len(sys.argv) != 2:
        print("usage: file_cycles.py OBJDIR", file=sys.stderr)
        return 2
    sys.setrecursionlimit(10000)
    objs, edges = graph(sys.argv[1])
    if not objs:
        print(f"file_cycles: no object files under {sys.argv[1]}", file=sys.stderr)
        return 2
    loops = components(edges)
    for comp in loops:
        print("a loop of files:", ", ".join(comp))
        for a in comp:
            for b, syms in sorted(edges[a].items()):
                if b in comp:
                    print(f"  {a} -> {b}: {' '.join(sorted(syms))}")
    print(f"file_cycles: {len(objs)} object files, {len(loops)} loop(s)")
    return 1 if loops else 0


if __name__ == "__main__":
    sys.exit(main())
