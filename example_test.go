package chameleon_test

import (
	"fmt"

	"github.com/chameleon-go/chameleon"
	"github.com/chameleon-go/chameleon/device/host"
	"github.com/chameleon-go/chameleon/trace"
)

// A host loop under a limit smaller than its working set: the Engine swaps
// the idle tensor out to make room and brings it back, byte-identical, for
// the op that needs it.
func ExampleNew() {
	dev, _ := host.New(96 << 10)
	defer dev.Close()
	eng, err := chameleon.New(dev, chameleon.WithMemoryLimit(96<<10))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer eng.Close()

	it := eng.Begin()
	run := func(name string, in []*chameleon.Tensor, out *chameleon.Tensor) {
		op := &chameleon.Op{Name: name, Phase: trace.PhaseForward, In: in, Out: []*chameleon.Tensor{out}}
		if err := it.Before(op); err != nil {
			fmt.Println(err)
			return
		}
		// The "kernel" runs on the compute stream, after the waits the
		// Engine queued there (a copy back, memory freed behind a copy).
		ptr, n := out.Ptr(), out.Size()
		dev.Launch(eng.ComputeStream(), func() {
			b := dev.Bytes(ptr, n)
			for i := range b {
				b[i] = byte(len(name))
			}
		})
		if err := it.After(op); err != nil {
			fmt.Println(err)
		}
	}
	a, _ := eng.NewTensor(40<<10, chameleon.Activation, "uint8", []int64{40 << 10})
	run("embed", nil, a)
	b, _ := eng.NewTensor(40<<10, chameleon.Activation, "uint8", []int64{40 << 10})
	run("mlp", nil, b)
	c, _ := eng.NewTensor(40<<10, chameleon.Activation, "uint8", []int64{40 << 10}) // a goes out
	run("norm", []*chameleon.Tensor{b}, c)
	eng.Release(b)
	d, _ := eng.NewTensor(8<<10, chameleon.Activation, "uint8", []int64{8 << 10})
	run("head", []*chameleon.Tensor{a}, d) // a comes back
	got := make([]byte, a.Size())
	dev.ReadDevice(got, a.Ptr())
	res := it.End()

	st := eng.Stats()
	fmt.Println("stage:", res.Stage)
	fmt.Println("swaps out/in:", st.SwapsOut, st.SwapsIn)
	fmt.Println("a intact:", got[0] == byte(len("embed")) && got[len(got)-1] == byte(len("embed")))
	fmt.Println("peak within the limit:", st.PeakDeviceBytes <= 96<<10)
	// Output:
	// stage: WARMUP
	// swaps out/in: 1 1
	// a intact: true
	// peak within the limit: true
}
