package device_test

import (
	"fmt"

	"github.com/chameleon-go/chameleon/device"
	"github.com/chameleon-go/chameleon/device/host"
)

// A swap-out and swap-in through the allocator and the pinned pool: no host
// wait on the hot path, and reuse ordered by events on the device.
func ExampleAllocator() {
	dev, _ := host.New(64 << 20)
	defer dev.Close()
	alloc := device.NewAllocator(dev)
	defer alloc.Close()
	_ = alloc.Reserve(16 << 20) // once, up front: never on the hot path
	pool := device.NewHostPool(dev)
	defer pool.Close()
	_ = pool.Reserve(16 << 20)

	compute := dev.DefaultStream()
	copyStream, _ := dev.NewStream()
	done, _ := dev.NewEvent()

	t, _ := alloc.Alloc(4<<20, compute)
	_ = dev.WriteDevice(t, []byte("activation"))

	// Swap out on the copy stream, after compute has produced t.
	buf, _ := pool.Get(4<<20, copyStream)
	_ = dev.Record(done, compute)
	_ = dev.StreamWait(copyStream, done)
	_ = dev.CopyD2H(buf, t, copyStream)
	_ = alloc.FreeOn(t, copyStream) // reusable once the copy is done

	// Compute may take the memory at once; its stream waits on the device.
	other, _ := alloc.Alloc(4<<20, compute)
	fmt.Println("reused:", other == t)

	// Swap back in.
	back, _ := alloc.Alloc(4<<20, copyStream)
	_ = dev.CopyH2D(back, buf, copyStream)
	_ = pool.PutOn(buf, copyStream)
	got := make([]byte, 10)
	_ = dev.ReadDevice(got, back)
	fmt.Println(string(got))
	// Output:
	// reused: true
	// activation
}
