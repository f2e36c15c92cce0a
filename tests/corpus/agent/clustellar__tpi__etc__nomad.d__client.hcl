client {
	enabled = true
}
