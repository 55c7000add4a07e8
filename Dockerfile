# syntax=docker/dockerfile:1
#
# Steward's one binary, for compose and any container platform.
#   docker build -t steward .
#   docker run --rm steward --help
#
# The runtime image is Alpine rather than distroless because two workers run
# local commands through /bin/sh: converge's exec runner (STEWARD_EXEC_COMMAND)
# and join's arm command. It runs as an unprivileged user with a fixed uid, so
# volumes can be prepared for it (chown 10001).

FROM golang:1.26 AS build
WORKDIR /src
# Dependencies first: this layer is reused until go.mod or go.sum change.
COPY go.mod go.sum ./
RUN go mod download
COPY . .
RUN CGO_ENABLED=0 GOOS=linux go build -trimpath \
      -ldflags "-s -w" \
      -o /out/steward ./cmd/steward

FROM alpine:3.22
RUN apk add --no-cache ca-certificates tzdata \
 && addgroup -S -g 10001 steward \
 && adduser -S -D -H -u 10001 -G steward -h /var/lib/steward steward \
 && install -d -o steward -g steward -m 0750 /var/lib/steward /keys /credentials /opt/steward
COPY --from=build /out/steward /usr/local/bin/steward
USER 10001:10001
WORKDIR /var/lib/steward
ENTRYPOINT ["steward"]
CMD ["--help"]
