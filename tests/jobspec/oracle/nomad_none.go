//go:build !nomadmirror

package main

import version "github.com/hashicorp/go-version"

// Debian packages neither Nomad's plugins/shared/structs nor its semver
// constraints, and their code is not copied here: without a Nomad source
// mirror at build time these questions have no Go answer.
const nomadSkip = "built without a Nomad source mirror: Nomad's plugins/shared/structs and helper/constraints/semver are not packaged"

func nomadSource() string { return "" }

func newSemverConstraint(string) (func(*version.Version) bool, error) { return nil, nil }

func parseAttribute(string) answer { return answer{"skip": nomadSkip} }

func compareAttributes(string, string) answer { return answer{"skip": nomadSkip} }

func units() answer { return answer{"skip": nomadSkip} }
