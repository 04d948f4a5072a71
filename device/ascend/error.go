package ascend

import (
	"fmt"

	"github.com/chameleon-go/chameleon/device"
)

// Error is an aclError returned by AscendCL. errors.Is maps it to the device
// sentinels: the allocation failures are device.ErrOutOfMemory, the
// parameter and handle errors device.ErrInvalidValue.
type Error int32

// AscendCL error codes this package branches on or names (acl_base.h and
// acl_rt error tables, CANN 7/8; e.g. hicann/runtime include/external/acl).
const (
	ErrorInvalidParam        Error = 100000 // ACL_ERROR_INVALID_PARAM
	ErrorUninitialize        Error = 100001 // ACL_ERROR_UNINITIALIZE
	ErrorRepeatInitialize    Error = 100002 // ACL_ERROR_REPEAT_INITIALIZE
	ErrorRepeatFinalize      Error = 100037 // ACL_ERROR_REPEAT_FINALIZE
	ErrorBadAlloc            Error = 200000 // ACL_ERROR_BAD_ALLOC
	ErrorInvalidDevice       Error = 200002 // ACL_ERROR_INVALID_DEVICE
	ErrorInvalidResource     Error = 200005 // ACL_ERROR_INVALID_RESOURCE_HANDLE
	ErrorRTParamInvalid      Error = 107000 // ACL_ERROR_RT_PARAM_INVALID
	ErrorRTInvalidDeviceID   Error = 107001 // ACL_ERROR_RT_INVALID_DEVICEID
	ErrorRTContextNull       Error = 107002 // ACL_ERROR_RT_CONTEXT_NULL
	ErrorRTInvalidHandle     Error = 107017 // ACL_ERROR_RT_INVALID_HANDLE
	ErrorRTMemoryAllocation  Error = 207001 // ACL_ERROR_RT_MEMORY_ALLOCATION
	ErrorRTNoDevice          Error = 207004 // ACL_ERROR_RT_NO_DEVICE
	ErrorRTInternal          Error = 507000 // ACL_ERROR_RT_INTERNAL_ERROR
	ErrorRTEventNotComplete  Error = 507006 // ACL_ERROR_RT_EVENT_NOT_COMPLETE
	ErrorRTStreamNotComplete Error = 507004 // ACL_ERROR_RT_STREAM_NOT_COMPLETE
	ErrorFailure             Error = 500001 // ACL_ERROR_FAILURE
)

var names = map[Error]string{
	ErrorInvalidParam:        "ACL_ERROR_INVALID_PARAM",
	ErrorUninitialize:        "ACL_ERROR_UNINITIALIZE",
	ErrorRepeatInitialize:    "ACL_ERROR_REPEAT_INITIALIZE",
	ErrorRepeatFinalize:      "ACL_ERROR_REPEAT_FINALIZE",
	ErrorBadAlloc:            "ACL_ERROR_BAD_ALLOC",
	ErrorInvalidDevice:       "ACL_ERROR_INVALID_DEVICE",
	ErrorInvalidResource:     "ACL_ERROR_INVALID_RESOURCE_HANDLE",
	ErrorRTParamInvalid:      "ACL_ERROR_RT_PARAM_INVALID",
	ErrorRTInvalidDeviceID:   "ACL_ERROR_RT_INVALID_DEVICEID",
	ErrorRTContextNull:       "ACL_ERROR_RT_CONTEXT_NULL",
	ErrorRTInvalidHandle:     "ACL_ERROR_RT_INVALID_HANDLE",
	ErrorRTMemoryAllocation:  "ACL_ERROR_RT_MEMORY_ALLOCATION",
	ErrorRTNoDevice:          "ACL_ERROR_RT_NO_DEVICE",
	ErrorRTInternal:          "ACL_ERROR_RT_INTERNAL_ERROR",
	ErrorRTEventNotComplete:  "ACL_ERROR_RT_EVENT_NOT_COMPLETE",
	ErrorRTStreamNotComplete: "ACL_ERROR_RT_STREAM_NOT_COMPLETE",
	ErrorFailure:             "ACL_ERROR_FAILURE",
}

// Name returns the AscendCL name of the code, or "aclError(N)".
func (e Error) Name() string {
	if n, ok := names[e]; ok {
		return n
	}
	return fmt.Sprintf("aclError(%d)", int32(e))
}

// Error implements error: the name and the code.
func (e Error) Error() string { return fmt.Sprintf("%s (%d)", e.Name(), int32(e)) }

// Is maps codes to the device sentinels.
func (e Error) Is(target error) bool {
	switch target {
	case device.ErrOutOfMemory:
		return e == ErrorRTMemoryAllocation || e == ErrorBadAlloc
	case device.ErrInvalidValue:
		return e == ErrorInvalidParam || e == ErrorRTParamInvalid || e == ErrorRTInvalidHandle ||
			e == ErrorInvalidResource || e == ErrorInvalidDevice || e == ErrorRTInvalidDeviceID
	}
	return false
}

func fail(call string, rc int32) error { return fmt.Errorf("ascend: %s: %w", call, Error(rc)) }

// check is fail for a non-zero status, nil for success.
func check(call string, rc int32) error {
	if rc == 0 {
		return nil
	}
	return fail(call, rc)
}
