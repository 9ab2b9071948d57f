// e2b@2.50.0 (the npm alias e2b-v1): the older routes POST /sandboxes and
// POST /sandboxes/{id}/connect.
import * as sdk from 'e2b-v1'
import { flows } from './flows.mjs'

flows('e2b@2.50.0', sdk)
