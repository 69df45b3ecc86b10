#!/usr/bin/env python3
"""Generates engine/unicode_data.c: the code point classes the tokenizer's
pre-tokenizers need (general category group + White_Space), as a two-stage
lookup table.

llama.cpp's tables (src/unicode-data.cpp) come from Unicode 15.1. This script
reads the Unicode Character Database files that Debian's `unicode-data`
package installs (/usr/share/unicode, Unicode 15.0 on Debian 12) and adds the
627 code points that Unicode 15.1 assigned (all of them ideographs or
ideographic description symbols), so the result matches llama.cpp's 15.1
classes. Without the UCD files it falls back to Python's own `unicodedata`
(an older Unicode on older Pythons; the header of the output says which).

    python3 tools/gen_unicode.py [--ucd /usr/share/unicode] [--out engine/unicode_data.c]

Classes (one byte per code point):
    low 3 bits: 0 undefined (Cn), 1 number (N*), 2 letter (L*), 3 separator (Z*),
                4 mark (M*), 5 punctuation (P*), 6 symbol (S*), 7 control (Cc Cf Co Cs)
    bit 3 (8):  White_Space (PropList.txt), as llama.cpp's is_whitespace
"""

import argparse
import os
import re
import sys

MAX_CP = 0x110000
BLOCK_SHIFT = 7
BLOCK = 1 << BLOCK_SHIFT

CATEGORY_CLASS = {
    "Cn": 0,
    "Nd": 1, "Nl": 1, "No": 1,
    "Lu": 2, "Ll": 2, "Lt": 2, "Lm": 2, "Lo": 2,
    "Zs": 3, "Zl": 3, "Zp": 3,
    "Mn": 4, "Mc": 4, "Me": 4,
    "Pc": 5, "Pd": 5, "Ps": 5, "Pe": 5, "Pi": 5, "Pf": 5, "Po": 5,
    "Sm": 6, "Sc": 6, "Sk": 6, "So": 6,
    "Cc": 7, "Cf": 7, "Co": 7, "Cs": 7,
}
WHITESPACE_BIT = 8

# White_Space from PropList.txt; unchanged since Unicode 6.3.
WHITE_SPACE = list(range(0x0009, 0x000D + 1)) + [0x0020, 0x0085, 0x00A0, 0x1680] + \
    list(range(0x2000, 0x200A + 1)) + [0x2028, 0x2029, 0x202F, 0x205F, 0x3000]

# Unicode 15.1 additions over 15.0 (627 code points).
UNICODE_15_1_ADDED = [(0x2FFC, 0x2FFF, "So"), (0x31EF, 0x31EF, "So"), (0x2EBF0, 0x2EE5D, "Lo")]


def categories_from_ucd(path):
    cats = ["Cn"] * MAX_CP
    lowers = {}
    first = None
    with open(path, encoding="utf-8") as f:
        for line in f:
            fields = line.rstrip("\n").split(";")
            cp = int(fields[0], 16)
            name, cat = fields[1], fields[2]
            if fields[13]:
                lowers[cp] = int(fields[13], 16)  # simple lowercase mapping
            if name.endswith(", First>"):
                first = cp
                continue
            if name.endswith(", Last>"):
                for c in range(first, cp + 1):
                    cats[c] = cat
                first = None
                continue
            cats[cp] = cat
    return cats, lowers


def categories_from_python():
    import unicodedata
    cats = [unicodedata.category(chr(cp)) for cp in range(MAX_CP)]
    lowers = {}
    for cp in range(MAX_CP):
        lo = chr(cp).lower()
        if len(lo) == 1 and ord(lo) != cp:
            lowers[cp] = ord(lo)
    return cats, lowers


def ucd_version(ucd):
    try:
        with open(os.path.join(ucd, "ReadMe.txt"), encoding="utf-8") as f:
            m = re.search(r"Version (\d+\.\d+\.\d+)", f.read())
            return m.group(1) if m else "unknown"
    except OSError:
        return "unknown"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ucd", default="/usr/share/unicode")
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "..", "engine",
                                                  "unicode_data.c"))
    args = ap.parse_args()

    data = os.path.join(args.ucd, "UnicodeData.txt")
    if os.path.exists(data):
        cats, lowers = categories_from_ucd(data)
        source = "the Unicode %s UCD\n * in %s" % (ucd_version(args.ucd), args.ucd)
    else:
        import unicodedata
        cats, lowers = categories_from_python()
        source = "Python unicodedata %s" % unicodedata.unidata_version
        print("warning: %s not found; using %s" % (data, source), file=sys.stderr)

    added = 0
    for lo, hi, cat in UNICODE_15_1_ADDED:
        for cp in range(lo, hi + 1):
            if cats[cp] == "Cn":
                cats[cp] = cat
                added += 1
    if added:
        source += ",\n * plus the %d code points Unicode 15.1 added" % added

    # The llama3/qwen2 scanners lower-case one character after an apostrophe
    # with ASCII rules; check that no other code point lower-cases into the
    # letters the contractions look for.
    for cp, lo in lowers.items():
        if cp >= 0x80 and lo in map(ord, "stmdrevl"):
            sys.exit("U+%04X lower-cases to %r: ASCII tolower is not enough" % (cp, chr(lo)))

    cls = bytearray(MAX_CP)
    for cp in range(MAX_CP):
        cls[cp] = CATEGORY_CLASS[cats[cp]]
    for cp in WHITE_SPACE:
        cls[cp] |= WHITESPACE_BIT

    blocks = {}
    stage1 = []
    stage2 = []
    for b in range(MAX_CP // BLOCK):
        chunk = bytes(cls[b * BLOCK:(b + 1) * BLOCK])
        if chunk not in blocks:
            blocks[chunk] = len(blocks)
            stage2.append(chunk)
        stage1.append(blocks[chunk])
    assert len(blocks) < 65536

    out = []
    out.append("/*")
    out.append(" * unicode_data.c - code point classes for the pre-tokenizers.")
    out.append(" * GENERATED by tools/gen_unicode.py (do not edit) from %s." % source)
    out.append(" *")
    out.append(" * class = cart_ucd_stage2[cart_ucd_stage1[cp >> %d] * %d + (cp & %d)]; see"
               % (BLOCK_SHIFT, BLOCK, BLOCK - 1))
    out.append(" * unicode_data.h for the meaning of the bits.")
    out.append(" */")
    out.append('#include "unicode_data.h"')
    out.append("")
    out.append("/* clang-format off */")
    out.append("")
    out.append("const uint16_t cart_ucd_stage1[%d] = {" % len(stage1))
    for i in range(0, len(stage1), 16):
        out.append("    " + ", ".join(str(v) for v in stage1[i:i + 16]) + ",")
    out.append("};")
    out.append("")
    out.append("const uint8_t cart_ucd_stage2[%d] = {" % (len(stage2) * BLOCK))
    for chunk in stage2:
        for i in range(0, BLOCK, 32):
            out.append("    " + ",".join(str(v) for v in chunk[i:i + 32]) + ",")
    out.append("};")
    out.append("")
    with open(args.out, "w", encoding="utf-8") as f:
        f.write("\n".join(out))
    print("wrote %s: %d blocks, from %s" % (args.out, len(stage2), source.replace("\n *", "")))


if __name__ == "__main__":
    main()
