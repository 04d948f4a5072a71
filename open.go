package chameleon

import (
	"errors"
	"fmt"

	"github.com/chameleon-go/chameleon/device"
	"github.com/chameleon-go/chameleon/device/ascend"
	"github.com/chameleon-go/chameleon/device/cuda"
)

// Open returns an Engine over the device of WithDevice or, without it, over
// the first accelerator whose runtime loads: CUDA (libcudart: the path of
// CHAMELEON_CUDART, then the CUDA toolkit's and the loader's well-known
// names, device 0; device/cuda), then Ascend (libascendcl: ASCEND_HOME_PATH's
// lib64, the toolkit's, the loader's; device/ascend). A device Open found is
// the Engine's: Close closes it. Where none loads, the error wraps
// ErrNoDevice and names every place tried. The host backend
// (device/host) is never chosen by itself: pass it with WithDevice.
//
// New(dev, opts...) is Open(WithDevice(dev), opts...).
func Open(opts ...Option) (*Engine, error) {
	var c config
	for _, o := range opts {
		if o != nil {
			o.apply(&c)
		}
	}
	if c.device != nil {
		return New(c.device, opts...)
	}
	dev, err := openDevice()
	if err != nil {
		return nil, err
	}
	e, err := New(dev, opts...)
	if err != nil {
		return nil, errors.Join(err, dev.Close())
	}
	e.onClose = append([]func() error{dev.Close}, e.onClose...) // closed last
	return e, nil
}

// openDevice opens the first accelerator whose runtime loads.
func openDevice() (device.Device, error) {
	cu, cuErr := cuda.New()
	if cuErr == nil {
		return cu, nil
	}
	as, asErr := ascend.New()
	if asErr == nil {
		return as, nil
	}
	return nil, fmt.Errorf("%w: CUDA: %w; Ascend: %w", ErrNoDevice, cuErr, asErr)
}
