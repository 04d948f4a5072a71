package device_test

import (
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/chameleon-go/chameleon/device"
)

// ent is one block of a test layout: free, movable, pinned (listed but not
// movable) or foreign (allocated, not listed).
type ent struct {
	name string
	size int64
	kind byte // 'f', 'm', 'p', 'x'
	cost int64
	age  uint64
}

func free(n int64) ent                         { return ent{size: n, kind: 'f'} }
func mov(name string, n int64, age uint64) ent { return ent{name: name, size: n, kind: 'm', age: age} }
func pin(name string, n int64) ent             { return ent{name: name, size: n, kind: 'p'} }
func foreign(n int64) ent                      { return ent{size: n, kind: 'x'} }

// layout builds segments block by block: each segment is reserved to the
// exact rounded size of its blocks and filled in address order while it is
// the only one with free memory; the free entries are freed at the end.
func layout(t *testing.T, segs ...[]ent) (*device.Allocator, []device.Resident, []string) {
	t.Helper()
	d := newCounting(t, 64<<20)
	a := device.NewAllocator(d)
	t.Cleanup(func() { a.Close() })
	round := func(n int64) int64 { return (n + device.BlockSize - 1) &^ (device.BlockSize - 1) }
	var frees []device.DevPtr
	var rs []device.Resident
	var names []string
	for _, seg := range segs {
		var total int64
		for _, e := range seg {
			total += round(e.size)
		}
		require.NoError(t, a.Reserve(total))
		var prev device.DevPtr
		for i, e := range seg {
			p, err := a.Alloc(e.size, 0)
			require.NoError(t, err)
			if i > 0 {
				require.Equal(t, prev+device.DevPtr(round(seg[i-1].size)), p, "layout out of order")
			}
			prev = p
			switch e.kind {
			case 'f':
				frees = append(frees, p)
			case 'm', 'p':
				cost := e.cost
				if cost == 0 {
					cost = e.size
				}
				rs = append(rs, device.Resident{Ptr: p, Movable: e.kind == 'm', Cost: cost, Age: e.age})
				names = append(names, e.name)
			}
		}
	}
	for _, p := range frees {
		require.NoError(t, a.Free(p))
	}
	return a, rs, names
}

func TestEvictionWindow(t *testing.T) {
	const k = 1 << 10
	withCost := func(e ent, c int64) ent { e.cost = c; return e }
	tests := []struct {
		name   string
		segs   [][]ent
		want   int64
		give   []string // evicted, in address order
		wantOK bool
	}{
		{
			name:   "a free block fits",
			segs:   [][]ent{{mov("a", k, 1), free(4 * k)}},
			want:   3 * k,
			give:   nil,
			wantOK: true,
		},
		{
			name:   "free neighbours count",
			segs:   [][]ent{{mov("a", k, 1), free(k), mov("b", 2*k, 2), free(k)}},
			want:   3 * k,
			give:   []string{"b"},
			wantOK: true,
		},
		{
			name:   "a window never spans two segments",
			segs:   [][]ent{{pin("a", k), free(2 * k)}, {free(2 * k), pin("b", k)}},
			want:   3 * k,
			wantOK: false,
		},
		{
			name:   "the cheaper segment wins",
			segs:   [][]ent{{free(k), mov("a", 3*k, 1)}, {pin("b", k), free(2 * k), mov("c", k, 9)}},
			want:   3 * k,
			give:   []string{"c"},
			wantOK: true,
		},
		{
			name:   "unmovable blocks split runs",
			segs:   [][]ent{{mov("a", k, 1), pin("p", k), mov("b", k, 2), free(k)}},
			want:   2 * k,
			give:   []string{"b"},
			wantOK: true,
		},
		{
			name:   "blocks the caller does not list are unmovable",
			segs:   [][]ent{{foreign(k), free(k), mov("a", k, 1)}},
			want:   3 * k,
			wantOK: false,
		},
		{
			name: "two cheap blocks beat one dear one",
			segs: [][]ent{{mov("big", 4*k, 1), free(k), mov("s1", k, 5), mov("s2", k, 6), free(k)}},
			want: 4 * k,
			give: []string{"s1", "s2"}, wantOK: true,
		},
		{
			name:   "cost is the caller's, not the size",
			segs:   [][]ent{{withCost(mov("ro", 4*k, 9), 1), pin("p", k), mov("rw", 4*k, 1)}},
			want:   4 * k,
			give:   []string{"ro"},
			wantOK: true,
		},
		{
			name:   "equal cost: the window used least recently",
			segs:   [][]ent{{mov("new", k, 5), free(k), mov("old", k, 3)}},
			want:   2 * k,
			give:   []string{"old"},
			wantOK: true,
		},
		{
			name:   "rounding: 600 bytes need two blocks",
			segs:   [][]ent{{free(512), mov("a", 100, 1), free(512), pin("p", 512), free(512)}},
			want:   600,
			give:   []string{"a"},
			wantOK: true,
		},
		{
			name:   "request larger than any segment",
			segs:   [][]ent{{mov("a", 2*k, 1)}, {mov("b", 2*k, 2)}},
			want:   3 * k,
			wantOK: false,
		},
		{
			name:   "everything movable in a full segment",
			segs:   [][]ent{{mov("a", k, 3), mov("b", k, 1), mov("c", k, 2)}},
			want:   2 * k,
			give:   []string{"b", "c"},
			wantOK: true,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a, rs, names := layout(t, tt.segs...)
			idx, ok, err := a.EvictionWindow(tt.want, rs, nil)
			require.NoError(t, err)
			require.Equal(t, tt.wantOK, ok)
			var got []string
			for _, i := range idx {
				got = append(got, names[i])
			}
			assert.Equal(t, tt.give, got)
			if !ok {
				return
			}
			// Evicting the window makes the request fit.
			for _, i := range idx {
				require.NoError(t, a.Free(rs[i].Ptr))
			}
			_, err = a.Alloc(tt.want, 0)
			assert.NoError(t, err)
		})
	}
}

func TestEvictionWindowErrors(t *testing.T) {
	a, rs, _ := layout(t, []ent{mov("a", 512, 1)})
	_, _, err := a.EvictionWindow(0, rs, nil)
	assert.ErrorIs(t, err, device.ErrInvalidValue)
	// Entries that are not allocated blocks are ignored.
	idx, ok, err := a.EvictionWindow(512, append(rs, device.Resident{Ptr: 1, Movable: true, Cost: 1}), nil)
	require.NoError(t, err)
	assert.True(t, ok)
	assert.Equal(t, []int{0}, idx)
	require.NoError(t, a.Close())
	_, _, err = a.EvictionWindow(512, rs, nil)
	assert.ErrorIs(t, err, device.ErrClosed)
}

// TestEvictionWindowBruteForce compares the window with every run of
// adjacent blocks of random fragmented layouts.
func TestEvictionWindowBruteForce(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 11))
	for trial := range 200 {
		var segs [][]ent
		for range 1 + rng.IntN(3) {
			var seg []ent
			for range 1 + rng.IntN(8) {
				n := int64(1+rng.IntN(6)) * 512
				switch r := rng.IntN(10); {
				case r < 3:
					seg = append(seg, free(n))
				case r < 5:
					seg = append(seg, pin("p", n))
				default:
					e := mov("m", n, uint64(rng.IntN(5)))
					e.cost = int64(1 + rng.IntN(4))
					seg = append(seg, e)
				}
			}
			segs = append(segs, seg)
		}
		want := int64(1+rng.IntN(12)) * 512
		a, rs, _ := layout(t, segs...)
		idx, ok, err := a.EvictionWindow(want, rs, nil)
		require.NoError(t, err)

		// Reference: every run of free or movable blocks inside a segment.
		bestCost, bestAge, found := int64(0), uint64(0), false
		for _, seg := range segs {
			for i := range seg {
				var got, cost int64
				var age uint64
				for j := i; j < len(seg) && seg[j].kind != 'p'; j++ {
					if seg[j].kind == 'm' {
						cost += seg[j].cost
						age = max(age, seg[j].age)
					}
					if got += seg[j].size; got >= want {
						if !found || cost < bestCost || (cost == bestCost && age < bestAge) {
							bestCost, bestAge, found = cost, age, true
						}
						break
					}
				}
			}
		}
		require.Equal(t, found, ok, "trial %d", trial)
		if !ok {
			continue
		}
		var cost int64
		var age uint64
		for _, i := range idx {
			cost += rs[i].Cost
			age = max(age, rs[i].Age)
			require.True(t, rs[i].Movable)
			require.NoError(t, a.Free(rs[i].Ptr))
		}
		assert.Equal(t, bestCost, cost, "trial %d", trial)
		assert.Equal(t, bestAge, age, "trial %d", trial)
		_, err = a.Alloc(want, 0)
		require.NoError(t, err, "trial %d", trial)
	}
}
