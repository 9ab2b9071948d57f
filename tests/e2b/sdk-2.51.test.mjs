// e2b@2.51.0: POST /v2/sandboxes, POST /v2/sandboxes/{id}/connect.
import * as sdk from 'e2b'
import { flows } from './flows.mjs'

flows('e2b@2.51.0', sdk)
