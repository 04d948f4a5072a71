package chameleon
import (
 _ "golang.org/x/sync/errgroup"
 _ "github.com/samber/lo"
 _ "go.opentelemetry.io/otel"
 _ "go.opentelemetry.io/otel/sdk/trace/tracetest"
 _ "github.com/stretchr/testify/require"
 _ "github.com/ebitengine/purego"
 _ "gonum.org/v1/plot"
 _ "go.uber.org/goleak"
)
