"""The Caffe frontend: caffe.proto schema, prototxt and caffemodel readers, layer mapping."""
