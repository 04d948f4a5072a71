package native

import (
	"fmt"

	"github.com/chameleon-go/chameleon/device"
)

// Copies implements the copies of device.Device (CopyH2D, CopyD2H, CopyD2D)
// over one asynchronous copy call of the runtime; a backend embeds it. Both
// cudaMemcpyKind and aclrtMemcpyKind number the directions 1 (host to
// device), 2 (device to host) and 3 (device to device).
type Copies struct {
	// Backend names the backend in errors ("cuda").
	Backend string
	// Enter and Leave bracket the call as the backend's other methods do
	// (closed check, current device).
	Enter func(what string) error
	Leave func()
	// Async queues n bytes from src to dst in direction kind on stream s.
	Async func(dst, src, n uintptr, kind int32, s uintptr) error
}

// Copy directions (cudaMemcpyKind, aclrtMemcpyKind).
const (
	HostToDevice   = 1
	DeviceToHost   = 2
	DeviceToDevice = 3
)

// CopyH2D implements device.Device.
func (c *Copies) CopyH2D(dst device.DevPtr, src device.HostBuf, s device.Stream) error {
	return c.copy(uintptr(dst), uintptr(src.Ptr()), src.Len(), HostToDevice, s)
}

// CopyD2H implements device.Device.
func (c *Copies) CopyD2H(dst device.HostBuf, src device.DevPtr, s device.Stream) error {
	return c.copy(uintptr(dst.Ptr()), uintptr(src), dst.Len(), DeviceToHost, s)
}

// CopyD2D implements device.Device.
func (c *Copies) CopyD2D(dst, src device.DevPtr, n int64, s device.Stream) error {
	return c.copy(uintptr(dst), uintptr(src), n, DeviceToDevice, s)
}

func (c *Copies) copy(dst, src uintptr, n int64, kind int32, s device.Stream) error {
	if err := c.Enter("copy"); err != nil {
		return err
	}
	defer c.Leave()
	if n < 0 {
		return fmt.Errorf("%s: copy %d bytes: %w", c.Backend, n, device.ErrInvalidValue)
	}
	if err := c.Async(dst, src, uintptr(n), kind, uintptr(s)); err != nil {
		return fmt.Errorf("%s: copy %d bytes %#x -> %#x (kind %d) on stream %#x: %w", c.Backend, n, src, dst, kind, uintptr(s), err)
	}
	return nil
}
