local T = require("cartridge.tensor")

describe("cartridge.tensor", function()
    it("creates zeroed row-major tensors and indexes them from 0", function()
        local a = T.new({ 2, 3 })
        assert.are.same({ 2, 3 }, a:shape())
        assert.are.same({ 3, 1 }, a:stride())
        assert.are.equal(0, a:get({ 1, 2 }))
        a:set({ 1, 2 }, 4.5)
        assert.are.equal(4.5, a:get({ 1, 2 }))
        a:free()
    end)

    it("multiplies through a transposed view and matches a hand product", function()
        local a = T.from_table({ 1, 2, 3, 4, 5, 6 }, { 2, 3 })
        local c = T.matmul(a, a:t()) -- [2, 2]
        local want = { 1 + 4 + 9, 4 + 10 + 18, 4 + 10 + 18, 16 + 25 + 36 }
        local got = c:totable()
        local worst = 0
        for i = 1, 4 do worst = math.max(worst, math.abs(got[i] - want[i])) end
        print(("  a @ a^T: max diff %g (tolerance 0)"):format(worst))
        assert.are.equal(0, worst)
    end)

    it("keeps storage alive through views and raises on bad indices", function()
        local a = T.from_table({ 1, 2, 3, 4, 5, 6 }, { 2, 3 })
        local row = a:select(0, 1)
        a:free()
        assert.are.same({ 4, 5, 6 }, row:totable())
        local ok, err = pcall(row.get, row, { 3 })
        assert.is_false(ok)
        assert.truthy(err:find("tensor:get", 1, true))
        ok, err = pcall(T.new, { 1, 2, 3, 4, 5 })
        assert.is_false(ok)
        assert.truthy(err:find("outside 0..4", 1, true), err)
    end)
end)
